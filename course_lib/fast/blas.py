"""The backend's matmul: BLAS's gemm, called through numpy, with one BLAS in the process.

matmul.py shows how a fast matmul is built (blocks in registers, tiles in the caches, packed
operands), and reaches a fraction of BLAS's speed. BLAS libraries add per-CPU assembly kernels,
and are the one thing every framework calls rather than rewrites.

Which BLAS matters. Inside an @njit function, `np.dot` calls scipy's copy of OpenBLAS, a second
library with a thread pool of its own beside numpy's. After a product, OpenBLAS's threads keep
spinning on the cores for a while in case another product follows; two pools in one process take
the cores from each other, and a product that alternates with numpy's ran 8x slower on 2 cores
(0.54 ms alone, 4 ms alternating, for 768x512 @ 512x128 in float32). So the backend calls numpy's
`matmul`, the same gemm the numpy backend and every numpy `@` use. It costs nothing here: numpy
loops over a batch in C, and hands gemm an operand that is the transpose of a contiguous array
(as in `x @ w.T`, and in most products of the backward pass) as that array with a transpose
flag, without copying it. Other views (a slice with a step, a broadcast row) are copied first.
"""

import functools

import numpy as np

from course_lib.tensor.broadcast import shape_broadcast
from course_lib.tensor.tensor_data import TensorData


@functools.lru_cache(maxsize=4096)
def _plan(a_shape, b_shape, a_dtype, b_dtype):
    """The output's shape (broadcast batch, n, m) and dtype, worked out once per pair of shapes."""
    return shape_broadcast(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1]), np.result_type(a_dtype, b_dtype)


def _readable(x):
    """x when gemm can read its matrices in place (rows or columns of unit stride, apart from each
    other); else a contiguous copy. numpy would otherwise run its own slow loop on such an operand."""
    (rs, cs), (r, c), item = x.strides[-2:], x.shape[-2:], x.itemsize
    if (cs == item and rs >= c * item) or (rs == item and cs >= r * item):
        return x
    return np.ascontiguousarray(x)


def matmul(a: TensorData, b: TensorData) -> TensorData:
    """The course's answer to exercise 06.11 (`blas_matmul`): read it once your check passes.

    a (..., n, k) @ b (..., k, m), batch dims broadcast, into a fresh contiguous result (k = 0: zeros)."""
    shape, dtype = _plan(a.shape, b.shape, a.dtype, b.dtype)
    out = np.empty(shape, dtype=dtype)
    np.matmul(_readable(a.to_numpy()), _readable(b.to_numpy()), out=out)
    return TensorData.contiguous(out.reshape(-1), shape)
