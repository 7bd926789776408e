"""The backend's matmul: a batched loop over BLAS's matrix product, compiled by Numba.

matmul.py shows how a fast matmul is built (blocks in registers, tiles in the caches,
packed operands), and reaches a fraction of BLAS's speed. BLAS libraries add per-CPU
assembly kernels, and are the one thing every framework calls rather than rewrites. Inside
an @njit function, `np.dot(A, B, out)` on 2-D float32 or float64 arrays calls BLAS's gemm
(scipy's copy of it), so this kernel only walks the batch, with no Python per matrix.

No packing copy either: gemm reads an operand either as it is or transposed, so an operand
that is the transpose of a contiguous array (as in `x @ w.T`, and in most matmuls of the
backward pass) goes in as that array, with the flag `a_t` or `b_t`. The flags are constants
of the kernel (one kernel per pair, built on first use): Numba then prunes the branch not
taken, and every slice has a known layout (C, or F for `.T`), which np.dot needs to call
gemm directly instead of a slow path that copies.
"""

import functools

import numpy as np
from numba import njit

from course_lib.fast.indexing import position


@functools.cache
def blas_matmul(a_t, b_t):
    """A kernel out[t] = A(t) @ B(t) over the batch, where A(t) = a[i].T if a_t else a[i] (B likewise).

    out: (batch, n, m) C-contiguous; a and b: 3-D C-contiguous stacks of matrices, of out's dtype.
    The batch index t walks `batch_shape`; the strides (in matrices, 0 where broadcast) find i.
    """
    @njit(cache=True)
    def kernel(out, a, b, batch_shape, a_batch_strides, b_batch_strides):
        for t in range(out.shape[0]):
            i = position(t, batch_shape, a_batch_strides, 0)
            if a_t:
                x = a[i].T
            else:
                x = a[i]
            i = position(t, batch_shape, b_batch_strides, 0)
            if b_t:
                y = b[i].T
            else:
                y = b[i]
            np.dot(x, y, out[t])
    return kernel


def stack(x, dtype):
    """x (..., r, c) as (a 3-D C-contiguous stack, transposed?): a free view when x or its transpose
    is contiguous, else a contiguous copy."""
    r, c = x.shape[-2:]
    if x.dtype == dtype:
        if x.flags.c_contiguous:
            return x.reshape(-1, r, c), False
        xt = np.swapaxes(x, -1, -2)
        if xt.flags.c_contiguous:
            return xt.reshape(-1, c, r), True
    return np.ascontiguousarray(x, dtype=dtype).reshape(-1, r, c), False
