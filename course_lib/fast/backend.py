"""The Numba backend for chapter 02's tensor engine: `set_backend("numba")`.

Each method turns TensorData views (storage, shape, strides, offset) into the int64 arrays
the kernels of flat.py and ops.py take, and an op's name into its code (tensor/scalar_ops.py),
and calls them; matmul goes to BLAS (blas.py). Nothing is copied except by matmul, which copies
an operand that is neither contiguous nor a transpose of a contiguous array (gemm reads both).
A 0-d tensor is run as shape (1,) with stride 0.

When every operand is contiguous (or a row, a column or a single number repeated over a
contiguous output), map, zip, where and reductions run the flat, vectorized kernels of flat.py;
everything else (permuted, sliced or expanded views) runs the strided kernels of ops.py.

A training step makes the same calls with the same shapes at every step, so each call's plan
(output shape, kernel, how it reads its operands) is worked out once and cached: on small tensors
the Python around a kernel costs more than the kernel.

One optional method goes beyond the four loops: `adam`, Adam's whole update as one kernel
(adam.py), which optim.Adam calls when the backend has it.

Starting a parallel loop wakes the thread pool, which costs microseconds on an idle machine
and milliseconds on a busy one. For small work one thread is faster, so each call picks its number of
threads from the amount of work (pool.py).
"""

import functools
import math

import numba
import numpy as np

from course_lib.fast import blas
from course_lib.fast.adam import fused_adam
from course_lib.fast.flat import BLOCK, flat_map, flat_reduce_inner, flat_reduce_last, flat_where, flat_zip, plan
from course_lib.fast.indexing import as_int_array, broadcast_strides
from course_lib.fast.ops import map_kernel, reduce_kernel, where_kernel, zip_kernel
from course_lib.fast.pool import set_threads, use_pool
from course_lib.tensor.backend import Backend
from course_lib.tensor.scalar_ops import MAP_CODE, REDUCE_CODE, ZIP_CODE
from course_lib.tensor.tensor_data import TensorData, shape_broadcast


def _sigmoid(x, out):
    """1 / (1 + exp(-x)), with exp of a non-positive number only (it never overflows): numpy's SIMD
    exp(-|x|) into out, then one compiled pass; no temporaries."""
    np.exp(np.negative(np.abs(x, out=out), out=out), out=out)
    _sigmoid_from_exp(out, x)


@numba.njit(cache=True)
def _sigmoid_from_exp(e, x):
    """e = exp(-|x|) becomes sigmoid(x): 1 / (1 + e) where x >= 0, e / (1 + e) where x < 0."""
    for i in range(e.size):
        e[i] = (1.0 if x[i] >= 0 else e[i]) / (1.0 + e[i])


# exp, log, tanh and sigmoid of contiguous data go to numpy's ufuncs. numpy calls a SIMD math library
# that computes 8 or 16 lanes at once; a Numba loop calls the C library's scalar exp or tanh once per
# element (393,216 float32 numbers: np.tanh 0.14 ms, a Numba loop of math.tanh 6.3 ms; np.exp 0.18 ms,
# math.exp 0.9 ms), unless Intel's SVML is installed for Numba to vectorize with.
VECTOR_MATH = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "sigmoid": _sigmoid}


def _parallel(work):
    """Whether a flat kernel should run its parallel flavour (setting the threads); the one-thread
    flavour never wakes the pool, so small calls skip `set_threads` and its cost."""
    if not use_pool(work):
        return False
    set_threads(work)
    return True


def _fresh(shape, dtype):
    return TensorData.contiguous(np.empty(math.prod(shape), dtype=dtype), shape)


def _flat(view):
    """The elements of a contiguous view, as a 1-D numpy array (no copy)."""
    storage = view.storage
    if view.offset == 0 and storage.size == view.size:
        return storage
    return storage[view.offset:view.offset + view.size]


def _layout(view, shape):
    """(storage, offset, strides as int64) of `view` read as `shape` (0-d runs as (1,))."""
    return view.storage, view.offset, _strides(view.shape, view.strides, shape)


@functools.lru_cache(maxsize=4096)
def _strides(shape, strides, out_shape):
    """Cached: a training loop asks for the same few layouts thousands of times."""
    return as_int_array(broadcast_strides(shape, strides, out_shape) if out_shape else (0,))


@functools.lru_cache(maxsize=4096)
def _run_shape(shape):
    return as_int_array(shape if shape else (1,))


# Each call's plan (the output's shape and size, which flat kernel serves contiguous operands, and
# how it reads them) is worked out once and looked up after that: on small tensors the Python
# around a kernel costs more than the kernel (about 4 microseconds against 0.3 for a call into Numba).

@functools.lru_cache(maxsize=4096)
def _map_plan(op, shape):
    size = math.prod(shape)
    return size, VECTOR_MATH.get(op) or flat_map(MAP_CODE[op], use_pool(size))


@functools.lru_cache(maxsize=4096)
def _zip_plan(op, a_shape, b_shape):
    """(output shape, size, flat kernel or None, cols)."""
    shape = shape_broadcast(a_shape, b_shape)
    size, how = math.prod(shape), plan(shape, a_shape, b_shape)
    if how is None:
        return shape, size, None, 0
    (ka, kb), cols = how
    return shape, size, flat_zip(ZIP_CODE[op], ka, kb, use_pool(size)), cols


@functools.lru_cache(maxsize=4096)
def _reduce_plan(op, shape, dim):
    """(output shape, the flat kernel for contiguous input, its extra arguments)."""
    out_shape = shape[:dim] + (1,) + shape[dim + 1:]
    size, n, inner = math.prod(shape), shape[dim], math.prod(shape[dim + 1:])
    parallel = use_pool(size)
    if inner == 1:
        return out_shape, flat_reduce_last(REDUCE_CODE[op], parallel), (n,)
    if inner >= 8:  # a narrower block would spend more on its accumulators than on the sums
        return out_shape, flat_reduce_inner(REDUCE_CODE[op], parallel), (n, inner)
    return out_shape, None, ()


class NumbaBackend(Backend):
    name = "numba"

    def map(self, op, a, out=None):
        out = _fresh(a.shape, a.dtype) if out is None else out
        if not out.size:
            return out
        if op == "id":  # a copy: numpy's copy loops walk any strides in the best order (4x faster than ops.py's)
            np.copyto(out.to_numpy(), a.to_numpy())
            return out
        size, kernel = _map_plan(op, a.shape)
        if a.size == out.size and a.is_contiguous() and out.is_contiguous():
            if op in VECTOR_MATH:
                kernel(_flat(a), out=_flat(out))
            else:
                _parallel(size)  # the kernel's flavour was picked by size; this sets the threads for it
                kernel(_flat(out), _flat(a), BLOCK)
        else:
            set_threads(out.size)
            map_kernel(MAP_CODE[op], out.storage, out.offset, _run_shape(out.shape), _layout(out, out.shape)[2],
                       *_layout(a, out.shape))
        return out

    def zip(self, op, a, b, out=None):
        shape, size, kernel, cols = _zip_plan(op, a.shape, b.shape)
        if out is None:
            out = _fresh(shape, a.dtype if a.dtype is b.dtype else np.result_type(a.dtype, b.dtype))
        if not size:
            return out
        if kernel is not None and a.is_contiguous() and b.is_contiguous() and out.is_contiguous():
            _parallel(size)  # the kernel's flavour was picked by size; this sets the threads for it
            kernel(_flat(out), _flat(a), _flat(b), cols)
        else:
            set_threads(size)
            zip_kernel(ZIP_CODE[op], out.storage, out.offset, _run_shape(out.shape), _layout(out, out.shape)[2],
                       *_layout(a, out.shape), *_layout(b, out.shape))
        return out

    def reduce(self, op, a, dim):
        shape, kernel, extra = _reduce_plan(op, a.shape, dim)
        out = _fresh(shape, a.dtype)
        if not out.size:
            return out
        if kernel is not None and a.is_contiguous():
            _parallel(a.size)  # the kernel's flavour was picked by size; this sets the threads for it
            kernel(out.storage, _flat(a), *extra)
        else:
            set_threads(a.size)
            reduce_kernel(REDUCE_CODE[op], out.storage, _run_shape(shape), a.storage, a.offset,
                          _strides(a.shape, a.strides, a.shape), dim, a.shape[dim])
        return out

    def where(self, cond, a, b):
        shape = shape_broadcast(shape_broadcast(cond.shape, a.shape), b.shape)
        out = _fresh(shape, np.result_type(a.dtype, b.dtype))
        how = plan(shape, cond.shape, a.shape, b.shape) if cond.is_contiguous() and a.is_contiguous() \
            and b.is_contiguous() else None
        if out.size and how:
            flat_where(*how[0], _parallel(out.size))(_flat(out), _flat(cond), _flat(a), _flat(b), how[1])
        elif out.size:
            set_threads(out.size)
            where_kernel(out.storage, _run_shape(shape), *_layout(cond, shape), *_layout(a, shape), *_layout(b, shape))
        return out

    def matmul(self, a, b):
        return blas.matmul(a, b)

    def adam(self, p, g, m, v, lr, betas, eps, t, decay, decoupled):
        """One fused Adam step over flat contiguous vectors (fast/adam.py): updates m and v in place and
        returns the new p. decay: None, one number, or a vector with one number per parameter."""
        new = _fresh(p.shape, p.dtype)
        per_parameter = isinstance(decay, TensorData)
        decay = _flat(decay) if per_parameter else np.array([decay or 0.0])
        b1, b2 = betas
        kernel = fused_adam(decoupled, per_parameter, _parallel(p.size))
        kernel(_flat(new), _flat(p), _flat(g), _flat(m), _flat(v), decay, lr, b1, b2, eps, 1 - b1 ** t, 1 - b2 ** t)
        return new


backend = NumbaBackend()
