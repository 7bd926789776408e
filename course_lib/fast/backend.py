"""The Numba backend for chapter 02's tensor engine: `set_backend("numba")`.

Each method turns TensorData views (storage, shape, strides, offset) into the int64 arrays
the kernels of ops.py and matmul.py take, and an op's name into its code (tensor/scalar_ops.py),
and calls them. Nothing is copied except by matmul, which makes its operands contiguous so its
inner loop can run at stride 1. A 0-d tensor is run as shape (1,) with stride 0.

Most calls in a training loop are small, with contiguous operands (or a single number, like
Adam's learning rate). map and zip send those to the flat, vectorized one-thread kernels of
ops.py, and everything else (big, permuted, sliced or broadcast) to the parallel strided kernels.

Starting a parallel loop wakes the thread pool, which costs microseconds on an idle machine
and milliseconds on a busy one. For small work one thread is faster, so `_threads` picks the
number of threads per call from the amount of work.
"""

import functools
import math

import numba
import numpy as np

from course_lib.fast.indexing import as_int_array, broadcast_strides, contiguous_strides
from course_lib.fast.matmul import matmul_kernel, pack_transposed, row_block
from course_lib.fast.ops import flat_map, flat_zip, map_kernel, reduce_kernel, where_kernel, zip_kernel
from course_lib.tensor.backend import Backend
from course_lib.tensor.scalar_ops import MAP_CODE, REDUCE_CODE, ZIP_CODE
from course_lib.tensor.tensor_data import TensorData, shape_broadcast

PARALLEL_MIN = 1 << 17  # elements (or multiply-adds / 16 in matmul) below which one thread is faster


def _threads(work):
    count = 1 if work < PARALLEL_MIN else numba.config.NUMBA_NUM_THREADS
    if count != numba.get_num_threads():
        numba.set_num_threads(count)


def _fresh(shape, dtype):
    shape = tuple(shape)
    return TensorData.contiguous(np.empty(math.prod(shape), dtype=dtype), shape)


def _flat(view):
    """The elements of a contiguous view, as a 1-D numpy array (no copy)."""
    return view.storage[view.offset:view.offset + view.size]


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


class NumbaBackend(Backend):
    name = "numba"

    def map(self, op, a, out=None):
        out = _fresh(a.shape, a.dtype) if out is None else out
        size = out.size
        if not size:
            return out
        if size < PARALLEL_MIN and a.size == size and a.is_contiguous() and out.is_contiguous():
            flat_map(MAP_CODE[op])(_flat(out), _flat(a))
        else:
            _threads(size)
            map_kernel(MAP_CODE[op], out.storage, out.offset, _run_shape(out.shape), _layout(out, out.shape)[2],
                       *_layout(a, out.shape))
        return out

    def zip(self, op, a, b, out=None):
        if out is None:
            out = _fresh(shape_broadcast(a.shape, b.shape), np.result_type(a.dtype, b.dtype))
        size = out.size
        if not size:
            return out
        if (size < PARALLEL_MIN and a.size in (1, size) and b.size in (1, size) and a.is_contiguous()
                and b.is_contiguous() and out.is_contiguous()):
            flat_zip(ZIP_CODE[op], a.size < size, b.size < size)(_flat(out), _flat(a), _flat(b))
        else:
            _threads(size)
            zip_kernel(ZIP_CODE[op], out.storage, out.offset, _run_shape(out.shape), _layout(out, out.shape)[2],
                       *_layout(a, out.shape), *_layout(b, out.shape))
        return out

    def reduce(self, op, a, dim):
        shape = a.shape[:dim] + (1,) + a.shape[dim + 1:]
        out = _fresh(shape, a.dtype)
        if out.size:
            _threads(a.size)
            reduce_kernel(REDUCE_CODE[op], out.storage, _run_shape(shape), a.storage, a.offset,
                          _strides(a.shape, a.strides, a.shape), dim, a.shape[dim])
        return out

    def where(self, cond, a, b):
        shape = shape_broadcast(shape_broadcast(cond.shape, a.shape), b.shape)
        out = _fresh(shape, np.result_type(a.dtype, b.dtype))
        if out.size:
            _threads(out.size)
            where_kernel(out.storage, _run_shape(shape), *_layout(cond, shape), *_layout(a, shape), *_layout(b, shape))
        return out

    def matmul(self, a, b):
        (n, k), m = a.shape[-2:], b.shape[-1]
        batch = shape_broadcast(a.shape[:-2], b.shape[:-2])
        dtype = np.result_type(a.dtype, b.dtype)
        out = (np.empty if k else np.zeros)((int(np.prod(batch, dtype=np.int64)), n, m), dtype=dtype)  # k = 0: 0s
        if out.size and k:
            a3 = np.ascontiguousarray(a.to_numpy(), dtype=dtype).reshape(-1, n, k)
            _threads(out.size * k // 16)
            bt3 = pack_transposed(b.to_numpy(), dtype)
            matmul_kernel(out, a3, bt3, _run_shape(batch), _batch_strides(a.shape[:-2], batch),
                          _batch_strides(b.shape[:-2], batch), row_block(n, out.shape[0], numba.get_num_threads()))
        return TensorData(out.reshape(-1), batch + (n, m))


def _batch_strides(shape, batch):
    """Strides, in whole matrices, that read a's (or b's) batch dims as the broadcast `batch`."""
    return as_int_array(broadcast_strides(shape, contiguous_strides(shape), batch) if batch else (0,))


backend = NumbaBackend()
