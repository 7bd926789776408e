"""Matrix multiply on the GPU: one thread per output, then tiles in shared memory.

Naive: thread (row, col) reads a row of A and a column of B straight from global
memory, 2K loads for K multiply-adds. Tiled: a block of TILE x TILE threads copies a
TILE x TILE tile of A and of B into shared memory once, and every thread of the block
reuses them, so each global load serves TILE multiply-adds.
"""

import numpy as np
from numba import cuda, float32

from course_lib.cuda.launch import blocks_for, launch

TILE = 16


# 14. naive matmul.
@cuda.jit
def k_matmul_naive(A, B, C):
    col, row = cuda.grid(2)
    if row < C.shape[0] and col < C.shape[1]:
        acc = 0.0
        for k in range(A.shape[1]):
            acc += A[row, k] * B[k, col]
        C[row, col] = acc


# 15. tiled matmul. Every thread loads one element of each tile (0 past the edges),
#     so the last, partial tile along K is handled like the others.
@cuda.jit
def k_matmul_tiled(A, B, C):
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col, row = cuda.grid(2)
    sA = cuda.shared.array((TILE, TILE), float32)
    sB = cuda.shared.array((TILE, TILE), float32)
    K = A.shape[1]
    acc = float32(0.0)
    for t in range((K + TILE - 1) // TILE):          # ceil: keep the partial last tile
        k = t * TILE
        sA[ty, tx] = A[row, k + tx] if row < A.shape[0] and k + tx < K else 0.0
        sB[ty, tx] = B[k + ty, col] if k + ty < K and col < B.shape[1] else 0.0
        cuda.syncthreads()                             # the tiles are full
        for j in range(TILE):
            acc += sA[ty, j] * sB[j, tx]
        cuda.syncthreads()                             # everyone is done with them
    if row < C.shape[0] and col < C.shape[1]:
        C[row, col] = acc


def grid_for(shape, block):
    """(x, y) blocks covering an output of shape (rows, cols) with blocks (bx, by)."""
    return blocks_for(shape[1], block[0]), blocks_for(shape[0], block[1])


def matmul(A, B, kernel=k_matmul_tiled, block=(TILE, TILE)):
    """C = A @ B for float32 matrices on the device."""
    A, B = np.ascontiguousarray(A, np.float32), np.ascontiguousarray(B, np.float32)
    C = np.empty((A.shape[0], B.shape[1]), np.float32)
    launch(kernel, grid_for(C.shape, block), block, A, B, C)
    return C
