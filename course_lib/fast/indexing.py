"""Where element i of a strided view lives in flat storage.

A view is (storage, offset, shape, strides): element `index` sits at
`storage[offset + sum(index[d] * strides[d])]`. The kernels walk their output in row-major
order, one ordinal 0 .. size-1 at a time, and need the storage position of that ordinal in
every operand. `position` (position.py's, compiled here) computes it with one divide per
dimension and no temporary index array; it is small, so LLVM inlines it into the kernels' loops.

Broadcasting needs no special case in the kernels: `broadcast_strides` gives a smaller
operand the output's number of dims and stride 0 on every broadcast dimension, so every
index along that dimension reads the same element.

`fresh` and `flat` are the two views every backend needs besides: a new contiguous output, and the
elements of a contiguous view as a 1-D array.
"""

import math

import numpy as np
from numba import njit

from course_lib.fast import position as positions
from course_lib.tensor.tensor_data import TensorData

#: Row-major ordinal over `shape` -> position in storage of the view (strides, offset): the very
#: function of position.py, compiled for the CPU.
position = njit(cache=True)(positions.position)


def broadcast_strides(shape, strides, out_shape):
    """Strides that read a view of `shape` as if it had `out_shape` (numpy's broadcasting).

    Dims are aligned on the right; a missing dim or a dim of size 1 gets stride 0.
    """
    extra = len(out_shape) - len(shape)
    assert extra >= 0, f"cannot broadcast {shape} to {out_shape}"
    result = [0] * extra
    for n, s, m in zip(shape, strides, out_shape[extra:]):
        assert n == m or n == 1, f"cannot broadcast {shape} to {out_shape}"
        result.append(s if n == m else 0)
    return tuple(result)


def as_int_array(values):
    """Shapes and strides go into kernels as int64 arrays (one compiled type for every ndim)."""
    return np.asarray(values, dtype=np.int64).reshape(-1)


def fresh(shape, dtype):
    """A new contiguous TensorData of `shape` (its elements not yet written)."""
    shape = tuple(shape)
    return TensorData.contiguous(np.empty(math.prod(shape), dtype=dtype), shape)


def flat(view):
    """The elements of a contiguous view, as a 1-D numpy array of exactly its size (no copy)."""
    storage = view.storage
    if view.offset == 0 and storage.size == view.size:
        return storage
    return storage[view.offset:view.offset + view.size]
