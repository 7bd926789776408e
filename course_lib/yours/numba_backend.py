"""Your chapter 06 kernels as a backend of the tensor engine: `set_backend("yours-numba")`.

    from course_lib.yours import numba_backend
    numba_backend.build()           # checks your saved kernels again; one line says whose runs what
    with T.use_backend("yours-numba"):
        loss = T.cross_entropy(model(x), y)     # runs on your strided_map, strided_zip, sum_dim, matmul

Which op runs on which kernel:
    map (every op)        your strided_map, with the op as `fn`
    zip (every op)        your strided_zip, which broadcasts by itself
    reduce "sum"          your sum_dim (and its sum_kernel)
    matmul                your matmul, once per matrix of the batch
    reduce "max", where   the course's Numba backend (no exercise wrote them)
A piece you have not saved (or `yours.use("06", False)`) hands its ops to the course's backend.

Your kernels take the op as a compiled function `fn`. Here each op name becomes a `cfunc` of the
course's scalar function (course_lib/tensor/scalar_ops.py): compiled functions of one signature
share one Numba type, so your strided_map compiles once per dtype for all twelve ops, not once per op.
A view's offset is applied by slicing its storage, as the exercises' kernels expect (they read
position 0 of the storage as the view's first element).
"""

import collections
import functools
import math

import numba
import numpy as np
from numba import cfunc

from course_lib import yours
from course_lib.tensor import scalar_ops
from course_lib.tensor.backend import Backend, get_backend, register_backend
from course_lib.tensor.tensor_data import TensorData, shape_broadcast
from course_lib.yours import backends

NAME = "yours-numba"
PIECES = ("strided_map", "strided_zip", "sum_dim", "sum_kernel", "matmul")
PARALLEL_MIN = 1 << 17  # elements below which one thread is faster (waking the pool costs more)


# ---- the op, as the `fn` your kernels call ----------------------------------------------------------

@functools.cache
def op_function(op):
    """The map or zip op named `op` as a cfunc (float64; float32 converts on the way): the `fn`
    your kernels call. It compiles the course's scalar function for that op (scalar_ops.py)."""
    if op in scalar_ops.MAP:
        return cfunc("float64(float64)", cache=True)(scalar_ops.MAP[op])
    return cfunc("float64(float64, float64)", cache=True)(scalar_ops.ZIP[op])


# ---- views as your kernels take them ----------------------------------------------------------------

@functools.lru_cache(maxsize=4096)
def _ints(values):
    """A shape or strides as an int64 array (cached: a training loop asks for the same few)."""
    return np.array(values, dtype=np.int64)


def _storage(view):
    """The view's storage from its first element on (your kernels read position 0 as the offset)."""
    return view.storage[view.offset:] if view.offset else view.storage


def _threads(work):
    """Your kernels are parallel; for small work the backend lets them run on one thread."""
    count = 1 if work < PARALLEL_MIN else numba.config.NUMBA_NUM_THREADS
    if count != numba.get_num_threads():
        numba.set_num_threads(count)


def _fresh(shape, dtype):
    shape = tuple(shape)
    return TensorData.contiguous(np.empty(math.prod(shape), dtype=dtype), shape)


class YoursNumbaBackend(Backend):
    """map, zip, reduce "sum" and matmul on your kernels where they are given; the rest on `course`."""

    name = NAME

    def __init__(self, kernels, course):
        self.kernels = {k: v for k, v in kernels.items() if v is not None}
        self.course = course
        self.calls = collections.Counter()  # how many times each of your kernels ran

    def whose(self):
        """[(op, the name of your kernel that runs it, or None: the course's)] for the backend's ops."""
        ops = [("map", "strided_map"), ("zip", "strided_zip"), ("reduce sum", "sum_dim"), ("matmul", "matmul")]
        return [(op, k if k in self.kernels else None) for op, k in ops] + [("reduce max", None), ("where", None)]

    def map(self, op, a, out=None):
        kernel = self.kernels.get("strided_map")
        if kernel is None:
            return self.course.map(op, a, out)
        out = _fresh(a.shape, a.dtype) if out is None else out
        if out.size:
            a = a if a.shape == out.shape else a.expand(out.shape)
            _threads(out.size)
            kernel(op_function(op), _storage(out), _ints(out.shape), _ints(out.strides), _storage(a), _ints(a.strides))
            self.calls["strided_map"] += 1
        return out

    def zip(self, op, a, b, out=None):
        kernel = self.kernels.get("strided_zip")
        if kernel is None:
            return self.course.zip(op, a, b, out)
        if out is None:
            out = _fresh(shape_broadcast(a.shape, b.shape), np.result_type(a.dtype, b.dtype))
        if out.size:
            _threads(out.size)
            kernel(op_function(op), _storage(out), _ints(out.shape), _ints(out.strides),
                   _storage(a), _ints(a.shape), _ints(a.strides), _storage(b), _ints(b.shape), _ints(b.strides))
            self.calls["strided_zip"] += 1
        return out

    def reduce(self, op, a, dim):
        sum_dim = self.kernels.get("sum_dim")
        if op != "sum" or sum_dim is None:
            return self.course.reduce(op, a, dim)
        shape = a.shape[:dim] + (1,) + a.shape[dim + 1:]
        if not math.prod(shape):
            return _fresh(shape, a.dtype)
        _threads(a.size)
        result = sum_dim(_storage(a), _ints(a.shape).copy(), _ints(a.strides), dim)
        self.calls["sum_dim"] += 1
        return TensorData.contiguous(np.ascontiguousarray(result, dtype=a.dtype).reshape(-1), shape)

    def matmul(self, a, b):
        kernel = self.kernels.get("matmul")
        if kernel is None:
            return self.course.matmul(a, b)
        (n, k), m = a.shape[-2:], b.shape[-1]
        dtype = np.result_type(a.dtype, b.dtype)
        A, B, batch = backends.matrix_pairs(a, b)
        out = np.empty((A.shape[0], n, m), dtype=dtype)
        _threads(n * k * m // 16)
        for t in range(out.shape[0] if out.size else 0):   # your kernel multiplies one pair of matrices
            kernel(out[t], np.ascontiguousarray(A[t], dtype=dtype), np.ascontiguousarray(B[t], dtype=dtype))
            self.calls["matmul"] += 1
        return TensorData.contiguous(out.reshape(-1), batch + (n, m))

    def where(self, cond, a, b):
        return self.course.where(cond, a, b)


def describe(backend):
    """The one line: which of the backend's ops run on your kernels, and which on the course's."""
    return backends.describe("06", NAME, backend.whose())


def build(verify=True, quiet=False):
    """The backend on your saved chapter 06 kernels (each checked again first), registered as
    "yours-numba". A saved kernel that fails its check raises CheckFailed naming it."""
    course = get_backend("numba")
    kernels = yours.pieces("06", dict.fromkeys(PIECES), verify=verify, quiet=True)   # None: the course's
    backend = YoursNumbaBackend(kernels, course)
    register_backend(NAME, backend)
    if not quiet:
        print(describe(backend))
    return backend
