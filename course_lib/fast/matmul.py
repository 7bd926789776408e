"""A parallel, tiled, batched matmul.

Loop order i-k-j: the innermost loop walks a row of B and a row of C with stride 1, so
each cache line loaded is used in full and the loop vectorizes. Tiling then keeps the
working set small: a block of TK rows of B stays in the L2 cache while the TI rows of a
block of A stream past it, so each row of B is read from memory n / TI times, not n times.
The innermost loop runs over a whole row (`range(m)`, starting at 0): Numba then knows the
index is never negative, skips its wrap-around check and vectorizes the loop. `prange` hands blocks of rows (of every matrix in
the batch) to the threads; each thread writes only its own rows of C, so there is no race.
"""

import numpy as np
from numba import njit, prange

from course_lib.fast.indexing import position

TI, TK = 16, 64  # small row blocks: even a 64-row batch splits across the threads


@njit(parallel=True, cache=True)
def matmul_kernel(out, a, b, batch_shape, a_batch_strides, b_batch_strides):
    """out[t] = a[pa(t)] @ b[pb(t)] for every matrix t of the batch; out must start at zero.

    out: (batch, n, m), a: (batch_a, n, k), b: (batch_b, k, m), all C-contiguous. The batch
    index t walks `batch_shape`; the strides (in matrices, 0 where broadcast) find a's and b's.
    """
    nbatch, n, m = out.shape
    k = a.shape[2]
    row_blocks = (n + TI - 1) // TI
    for t in prange(nbatch * row_blocks):
        bi = t // row_blocks
        i0 = (t % row_blocks) * TI
        i1 = min(i0 + TI, n)
        A = a[position(bi, batch_shape, a_batch_strides, 0)]
        B = b[position(bi, batch_shape, b_batch_strides, 0)]
        C = out[bi]
        for k0 in range(0, k, TK):
            k1 = min(k0 + TK, k)
            for i in range(i0, i1):
                for kk in range(k0, k1):
                    aik = A[i, kk]
                    for j in range(m):
                        C[i, j] += aik * B[kk, j]


def matmul(a, b):
    """a @ b for 2-D numpy arrays, with the tiled kernel (a convenience for the lesson)."""
    out = np.zeros((1, a.shape[0], b.shape[1]), dtype=np.result_type(a, b))
    one = np.zeros(1, dtype=np.int64)
    matmul_kernel(out, np.ascontiguousarray(a)[None], np.ascontiguousarray(b)[None], np.ones(1, np.int64), one, one)
    return out[0]
