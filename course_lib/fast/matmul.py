"""A parallel, batched matmul built from 4x4 blocks of dot products.

C[i, j] is the dot product of row i of A and column j of B. `matmul` below hands the kernel
B transposed and packed (`bt`, contiguous), so that column j of B is the contiguous row j of
bt, and both operands of every dot product are read at stride 1. (The tensor backend's matmul is
blas.py's; this file is how a fast matmul is built, and what lesson 06 measures against it.)

Register blocking: the kernel computes a 4x4 block of C at once, in 16 local accumulators
that live in registers. One pass over k loads 4 rows of A and 4 rows of bt (8 loads) for
16 multiply-adds, where the i-k-j loop needs a load and a store of C for every one. With
`fastmath` reassociation LLVM may reorder each sum, so it vectorizes the k loop (16 float32
lanes per instruction with AVX-512).

Tiling: `prange` gives each thread a block of `ti` rows of A (of any matrix in the batch). The
thread walks the columns of C 4 at a time, and for each group runs down its rows: those 4
rows of bt stay in the L1 cache while the block of A stays in L2. Each task reads all of bt
once, so bigger blocks mean fewer passes over bt (`row_block`), as long as there are enough
blocks to keep every thread busy. Each thread writes only its own rows of C, so there is no
race. Edges (sizes not a multiple of 4) take a plain dot product per element.

Packing: transposing B costs a copy. numpy's copy of a transposed 1024x1024 array walks one
side with a stride of 4 KB and takes longer than half the matmul; `transpose_kernel` copies
32x32 blocks instead, in parallel, so both sides stay within a few cache lines.
"""

import numba
import numpy as np
from numba import njit, prange

from course_lib.fast.indexing import position

TB = 32  # the side of the blocks that transpose_kernel copies
_MATH = {"reassoc", "contract"}  # may reorder sums and fuse multiply-adds; keeps inf and nan handling


@njit(inline="always", fastmath=_MATH, cache=True)
def dot(a, b, k):
    """a[:k] . b[:k] (one element of C, for the edges)."""
    s = np.float32(0)  # Numba widens it to float64 when a and b are float64
    for kk in range(k):
        s += a[kk] * b[kk]
    return s


@njit(inline="always", fastmath=_MATH, cache=True)
def block4x4(C, A, Bt, i, j, k):
    """C[i:i+4, j:j+4] = A[i:i+4] @ Bt[j:j+4].T, in 16 accumulators."""
    a0, a1, a2, a3 = A[i], A[i + 1], A[i + 2], A[i + 3]
    b0, b1, b2, b3 = Bt[j], Bt[j + 1], Bt[j + 2], Bt[j + 3]
    z = np.float32(0)  # Numba widens the accumulators to float64 when A and Bt are float64
    s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = z
    s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = z
    for kk in range(k):
        x0, x1, x2, x3 = a0[kk], a1[kk], a2[kk], a3[kk]
        y0, y1, y2, y3 = b0[kk], b1[kk], b2[kk], b3[kk]
        s00 += x0 * y0; s01 += x0 * y1; s02 += x0 * y2; s03 += x0 * y3  # noqa: E702
        s10 += x1 * y0; s11 += x1 * y1; s12 += x1 * y2; s13 += x1 * y3  # noqa: E702
        s20 += x2 * y0; s21 += x2 * y1; s22 += x2 * y2; s23 += x2 * y3  # noqa: E702
        s30 += x3 * y0; s31 += x3 * y1; s32 += x3 * y2; s33 += x3 * y3  # noqa: E702
    C[i, j], C[i, j + 1], C[i, j + 2], C[i, j + 3] = s00, s01, s02, s03
    C[i + 1, j], C[i + 1, j + 1], C[i + 1, j + 2], C[i + 1, j + 3] = s10, s11, s12, s13
    C[i + 2, j], C[i + 2, j + 1], C[i + 2, j + 2], C[i + 2, j + 3] = s20, s21, s22, s23
    C[i + 3, j], C[i + 3, j + 1], C[i + 3, j + 2], C[i + 3, j + 3] = s30, s31, s32, s33


@njit(parallel=True, fastmath=_MATH, cache=True)
def matmul_kernel(out, a, bt, batch_shape, a_batch_strides, b_batch_strides, ti):
    """The course's answer to exercise 06.6 (`matmul`): read it once your check passes."""
    """out[t] = a[pa(t)] @ bt[pb(t)].T for every matrix t of the batch, in tasks of `ti` rows.

    out: (batch, n, m), a: (batch_a, n, k), bt: (batch_b, m, k) (B transposed), all
    C-contiguous. The batch index t walks `batch_shape`; the strides (in matrices, 0 where
    broadcast) find a's and bt's.
    """
    nbatch, n, m = out.shape
    k = a.shape[2]
    row_blocks = (n + ti - 1) // ti
    for t in prange(nbatch * row_blocks):
        bi = t // row_blocks
        i0 = (t % row_blocks) * ti
        i1 = min(i0 + ti, n)
        A = a[position(bi, batch_shape, a_batch_strides, 0)]
        Bt = bt[position(bi, batch_shape, b_batch_strides, 0)]
        C = out[bi]
        for j in range(0, m, 4):
            for i in range(i0, i1, 4):
                if i + 4 <= i1 and j + 4 <= m:
                    block4x4(C, A, Bt, i, j, k)
                else:
                    for ii in range(i, min(i + 4, i1)):
                        for jj in range(j, min(j + 4, m)):
                            C[ii, jj] = dot(A[ii], Bt[jj], k)


def row_block(n, nbatch, threads):
    """Rows per task: up to 128 (fewer passes over bt), but at least 2 tasks per thread, and at least 16."""
    ti = 128
    while ti > 16 and nbatch * ((n + ti - 1) // ti) < 2 * threads:
        ti //= 2
    return ti


@njit(parallel=True, cache=True)
def transpose_kernel(b, bt):
    """bt[t] = b[t].T for every matrix of b (batch, k, m), one TB x TB block per task."""
    nbatch, k, m = b.shape
    kb, mb = (k + TB - 1) // TB, (m + TB - 1) // TB
    for t in prange(nbatch * kb * mb):
        bi, r = t // (kb * mb), t % (kb * mb)
        k0, m0 = (r // mb) * TB, (r % mb) * TB
        for j in range(m0, min(m0 + TB, m)):
            for kk in range(k0, min(k0 + TB, k)):
                bt[bi, j, kk] = b[bi, kk, j]


def pack_transposed(b, dtype):
    """b (..., k, m) as a C-contiguous (batch, m, k) array of `dtype`; free when b is itself a transpose."""
    k, m = b.shape[-2:]
    bt = np.swapaxes(b, -1, -2)
    if bt.flags.c_contiguous and bt.dtype == dtype:
        return bt.reshape(-1, m, k)
    b3 = b.astype(dtype, copy=False).reshape(-1, k, m)
    out = np.empty((b3.shape[0], m, k), dtype=dtype)
    transpose_kernel(b3, out)
    return out


def matmul(a, b):
    """a @ b for 2-D numpy arrays, with the blocked kernel (a convenience for the lesson)."""
    dtype = np.result_type(a, b)
    out = np.empty((1, a.shape[0], b.shape[1]), dtype=dtype)
    one = np.zeros(1, dtype=np.int64)
    matmul_kernel(out, np.ascontiguousarray(a, dtype=dtype)[None], pack_transposed(b, dtype), np.ones(1, np.int64),
                  one, one, row_block(a.shape[0], 1, numba.get_num_threads()))
    return out[0]
