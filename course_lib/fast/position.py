"""Where element number `ordinal` (row-major) of a strided view lives in its storage.

A plain Python function over integer sequences, compiled unchanged: with `njit` for the CPU backend
(indexing.py) and with `cuda.jit(device=True)` for the CUDA backend (cuda/backend.py). It is the
course's answer to exercise 06.2: read it once your check passes.
"""

import numpy as np


def position(ordinal, shape, strides, offset):
    """The course's answer to exercise 06.2 (`position`): read it once your check passes.

    Ordinal (row-major over `shape`) -> position in storage of the view (strides, offset):
    to_index and index_to_position in one loop, with no index array (what a kernel wants)."""
    pos = np.int64(offset)
    rest = np.int64(ordinal)  # a Numba prange index may be unsigned; uint64 mixed with int64 gives float64
    for d in range(len(shape) - 1, -1, -1):
        pos += (rest % shape[d]) * strides[d]
        rest //= shape[d]
    return pos
