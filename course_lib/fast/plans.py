"""The Numba backend's speed layer: what backend.py's calls work out once per shape, and then look up.

backend.py reads as "contiguous operands: a flat kernel; any other view: a strided kernel". What makes
those calls fast on the small tensors of a training step is here, out of its way:

1. Cached plans. A training step makes the same calls with the same shapes at every step, so each call's
   plan (the output's shape, the flat kernel that serves contiguous operands, how it reads them) is
   worked out once and looked up after that: on small tensors the Python around a kernel costs more than
   the kernel (about 4 microseconds against 0.3 for a call into Numba). The int64 shapes and strides the
   strided kernels take are made once per layout, too.
2. numpy's SIMD math for exp, log, tanh and sigmoid of contiguous data (VECTOR_MATH).
3. The thread choice (pool.py's policy): each flat kernel comes in a one-thread and a parallel flavour,
   picked by the amount of work. The one-thread flavour never wakes the pool, so small calls skip
   `set_threads` and its cost.

A plan's flat kernel is `run(out, *operands)` on 1-D arrays (the elements of contiguous views), with its
flavour picked, its threads set and its extra arguments bound; None where no flat kernel serves the call.
"""

import functools
import math

import numba
import numpy as np

from course_lib.fast.adam import fused_adam
from course_lib.fast.flat import BLOCK, flat_map, flat_reduce_inner, flat_reduce_last, flat_where, flat_zip, plan
from course_lib.fast.indexing import as_int_array, broadcast_strides
from course_lib.fast.pool import set_threads, use_pool
from course_lib.tensor.broadcast import shape_broadcast
from course_lib.tensor.scalar_ops import MAP_CODE, REDUCE_CODE, ZIP_CODE


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


def _threaded(kernel, work, *extra):
    """run(*arrays) = kernel(*arrays, *extra), on the flavour `kernel` was built as for `work` elements:
    the parallel one sets the pool's threads first; the one-thread one leaves the pool asleep."""
    if not use_pool(work):
        return lambda *arrays: kernel(*arrays, *extra)

    def run(*arrays):
        set_threads(work)
        return kernel(*arrays, *extra)
    return run


def _ufunc(fn):
    return lambda out, a: fn(a, out=out)


@functools.lru_cache(maxsize=4096)
def map_plan(op, shape):
    """run(out, a) for contiguous a and out of `shape`."""
    if op in VECTOR_MATH:
        return _ufunc(VECTOR_MATH[op])
    size = math.prod(shape)
    return _threaded(flat_map(MAP_CODE[op], use_pool(size)), size, BLOCK)


@functools.lru_cache(maxsize=4096)
def zip_plan(op, a_shape, b_shape):
    """(the output's shape, run(out, a, b) for contiguous operands, or None when flat.py's kinds cannot
    read them: a broadcast that is neither a row, a column nor one number)."""
    shape = shape_broadcast(a_shape, b_shape)
    how = plan(shape, a_shape, b_shape)
    if how is None:
        return shape, None
    (a_kind, b_kind), cols = how
    size = math.prod(shape)
    return shape, _threaded(flat_zip(ZIP_CODE[op], a_kind, b_kind, use_pool(size)), size, cols)


@functools.lru_cache(maxsize=4096)
def reduce_plan(op, shape, dim):
    """(the output's shape, size 1 along dim; run(out, a) for contiguous a, or None)."""
    out_shape = shape[:dim] + (1,) + shape[dim + 1:]
    size, n, inner = math.prod(shape), shape[dim], math.prod(shape[dim + 1:])
    if inner == 1:
        return out_shape, _threaded(flat_reduce_last(REDUCE_CODE[op], use_pool(size)), size, n)
    if inner >= 8:  # a narrower block would spend more on its accumulators than on the sums
        return out_shape, _threaded(flat_reduce_inner(REDUCE_CODE[op], use_pool(size)), size, n, inner)
    return out_shape, None


@functools.lru_cache(maxsize=4096)
def where_plan(shape, cond_shape, a_shape, b_shape):
    """run(out, cond, a, b) for contiguous operands broadcast to `shape`, or None."""
    how = plan(shape, cond_shape, a_shape, b_shape)
    if how is None:
        return None
    size = math.prod(shape)
    return _threaded(flat_where(*how[0], use_pool(size)), size, how[1])


@functools.lru_cache(maxsize=4096)
def adam_plan(decoupled, per_parameter, size):
    """run(new_p, p, g, m, v, decay, lr, b1, b2, eps, c1, c2): fast/adam.py's kernel for `size` parameters."""
    return _threaded(fused_adam(decoupled, per_parameter, use_pool(size)), size)


# ---- views as the strided kernels take them ----------------------------------------------------------

def strides(view, shape):
    """The view's strides read as `shape` (stride 0 along broadcast dims), as int64; (0,) for a 0-d shape."""
    return _strides(view.shape, view.strides, shape)


@functools.lru_cache(maxsize=4096)
def _strides(shape, strides, out_shape):
    return as_int_array(broadcast_strides(shape, strides, out_shape) if out_shape else (0,))


@functools.lru_cache(maxsize=4096)
def run_shape(shape):
    """The shape a strided kernel walks, as int64: a 0-d tensor runs as shape (1,)."""
    return as_int_array(shape if shape else (1,))
