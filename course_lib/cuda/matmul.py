"""Matrix multiply on the GPU, four steps up the ladder that leads to cuBLAS.

C = A @ B costs M*N*K multiply-adds, whatever the kernel. What the steps change is how often each
operand is fetched, and from where:

    step          each thread computes          global loads per multiply-add    shared loads per multiply-add
    coalesced     1 element of C                2                                0
    tiled         1 element, TILE x TILE tiles  2 / TILE                         2
    1D blocking   TM elements of a column       1/BN + 1/BM                      1 + 1/TM
    2D blocking   a TM x TN block               1/BN + 1/BM                      1/TM + 1/TN

(the tracer in trace.py counts these loads; the lesson draws them). Every size a kernel depends on
(TILE, BM, BN, BK, TM, TN) is a compile-time constant: each factory below closes over its sizes, so
Numba sees numbers, `cuda.local.array((TM, TN), float32)` can live in registers once the loops over
it are unrolled, and one factory gives a 16 x 16 kernel for a GPU and a 4 x 4 one for the simulator.

Index arithmetic is cast to 32 bits (`int32(...)`) where it feeds shared memory and registers: Numba
computes integers in 64 bits, which costs registers in a kernel that needs them for its accumulators.
"""

import numpy as np
from numba import config, cuda, float32, int32

from course_lib.cuda.launch import blocks_for, launch


@cuda.jit
def k_matmul_naive(A, B, C):
    """The course's answer to exercise 07.14 (`matmul_naive`): read it once your check passes.

    One thread per element of C; x runs along the columns, so the 32 threads of a warp read 32
    neighbouring elements of a row of B and write 32 neighbours of C (coalesced), and all read the
    same element of A (one broadcast)."""
    col, row = cuda.grid(2)
    if row < C.shape[0] and col < C.shape[1]:
        acc = float32(0.0)
        for k in range(A.shape[1]):
            acc += A[row, k] * B[k, col]
        C[row, col] = acc


def tiled_kernel(TILE):
    """The course's answer to exercise 07.15 (`matmul_tiled`): read it once your check passes.

    The shared-memory tiled kernel for TILE x TILE blocks. Every thread loads one element of each
    tile (0 past the edges), so the last, partial tile along K is handled like the others."""

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

    return k_matmul_tiled


def blocked_1d_kernel(BM, BN, BK, TM):
    """The course's answer to exercise 07.16 (`matmul_1d`): read it once your check passes.

    A block of (BN, BM // TM) threads computes a BM x BN tile of C; thread (tx, ty) keeps TM elements
    of column tx (rows ty*TM ... ty*TM + TM - 1 of the tile) in registers. Along K, the block copies a
    BM x BK tile of A and a BK x BN tile of B into shared memory; then, for each k, a thread reads one
    element of B once and uses it for its TM multiply-adds."""
    THREADS = BN * (BM // TM)
    LOADS_A, LOADS_B = -(-BM * BK // THREADS), -(-BK * BN // THREADS)     # elements of each tile per thread, at most

    @cuda.jit
    def k_matmul_1d(A, B, C):
        As = cuda.shared.array((BM, BK), float32)
        Bs = cuda.shared.array((BK, BN), float32)
        acc = cuda.local.array(TM, float32)
        tx = int32(cuda.threadIdx.x)
        ty = int32(cuda.threadIdx.y)
        top = int32(cuda.blockIdx.y * BM)                # the tile of C this block computes starts here
        left = int32(cuda.blockIdx.x * BN)
        n_rows, n_inner, n_cols = int32(A.shape[0]), int32(A.shape[1]), int32(B.shape[1])
        for i in range(TM):
            acc[i] = 0.0
        for k0 in range(0, n_inner, BK):
            for q in range(LOADS_A):                     # consecutive threads, consecutive k: coalesced
                e = tx + ty * BN + q * THREADS
                i, k = top + e // BK, k0 + e % BK
                if e < BM * BK:
                    As[e // BK, e % BK] = A[i, k] if i < n_rows and k < n_inner else 0.0
            for q in range(LOADS_B):
                e = tx + ty * BN + q * THREADS
                k, j = k0 + e // BN, left + e % BN
                if e < BK * BN:
                    Bs[e // BN, e % BN] = B[k, j] if k < n_inner and j < n_cols else 0.0
            cuda.syncthreads()
            for k in range(BK):
                b = Bs[k, tx]                            # one shared load, TM multiply-adds
                for i in range(TM):
                    acc[i] += As[ty * TM + i, k] * b
            cuda.syncthreads()
        for i in range(TM):
            if top + ty * TM + i < n_rows and left + tx < n_cols:
                C[top + ty * TM + i, left + tx] = acc[i]

    return k_matmul_1d


def blocked_2d_kernel(BM, BN, BK, TM, TN, min_blocks=None):
    """The course's answer to exercise 07.17 (`matmul_2d`): read it once your check passes.

    A block of (BN // TN, BM // TM) threads computes a BM x BN tile of C; each thread keeps a TM x TN
    block of it in registers: rows ty + i * (BM // TM) and columns tx + j * (BN // TN) of the tile.
    Spreading a thread's rows and columns that way makes the threads of a warp read neighbouring
    words of shared memory (no bank conflict) and write neighbouring elements of C (coalesced).
    For each k, a thread loads TM elements of A and TN of B from shared memory into registers and
    does TM * TN multiply-adds with them. A is stored transposed, As[k, m], so that the TM values
    a thread needs for one k lie in one row; its rows are padded by 4 words so that the transposing
    stores of a warp fall in 32 different banks. `min_blocks` asks the compiler to fit that many
    blocks on one SM (it then keeps each thread under 65536 / (min_blocks * threads) registers)."""
    SY, SX = BM // TM, BN // TN                  # threads along y and x: the strides between a thread's rows, columns
    THREADS = SX * SY
    SIZE_A, SIZE_B = BM * BK, BK * BN
    LA, LB = -(-SIZE_A // THREADS), -(-SIZE_B // THREADS)      # elements of each tile a thread loads, at most
    BMP = BM + 4                                 # padded row of the transposed A tile
    bounds = min_blocks and not config.ENABLE_CUDASIM            # the simulator has no registers to bound
    jit = cuda.jit(launch_bounds=(THREADS, min_blocks)) if bounds else cuda.jit

    @jit
    def k_matmul_2d(A, B, C):
        tx, ty = int32(cuda.threadIdx.x), int32(cuda.threadIdx.y)
        tid = ty * SX + tx
        row0, col0 = int32(cuda.blockIdx.y * BM), int32(cuda.blockIdx.x * BN)
        M, K, N = int32(A.shape[0]), int32(A.shape[1]), int32(B.shape[1])
        As = cuda.shared.array((BK, BMP), float32)
        Bs = cuda.shared.array((BK, BN), float32)
        acc = cuda.local.array((TM, TN), float32)
        a = cuda.local.array(TM, float32)
        b = cuda.local.array(TN, float32)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = 0.0
        for k0 in range(0, K, BK):
            for q in range(LA):                          # read along k (coalesced), store transposed
                e = tid + q * THREADS
                r, c = e // BK, e % BK
                if e < SIZE_A:
                    As[c, r] = A[row0 + r, k0 + c] if row0 + r < M and k0 + c < K else 0.0
            for q in range(LB):
                e = tid + q * THREADS
                r, c = e // BN, e % BN
                if e < SIZE_B:
                    Bs[r, c] = B[k0 + r, col0 + c] if k0 + r < K and col0 + c < N else 0.0
            cuda.syncthreads()
            for k in range(BK):
                for i in range(TM):
                    a[i] = As[k, ty + i * SY]
                for j in range(TN):
                    b[j] = Bs[k, tx + j * SX]
                for i in range(TM):
                    for j in range(TN):
                        acc[i, j] += a[i] * b[j]
            cuda.syncthreads()
        for i in range(TM):
            row = row0 + ty + i * SY
            for j in range(TN):
                col = col0 + tx + j * SX
                if row < M and col < N:
                    C[row, col] = acc[i, j]

    return k_matmul_2d


# ---- the ladder at GPU sizes ------------------------------------------------------------------------

TILE = 16
k_matmul_tiled = tiled_kernel(TILE)
k_matmul_1d = blocked_1d_kernel(64, 64, 8, 8)             # 512 threads, 8 outputs each
k_matmul_2d = blocked_2d_kernel(128, 128, 8, 8, 8, min_blocks=2)    # 256 threads, 64 outputs each

#: step -> (kernel, block, rows and columns of C one block computes), from the bottom of the ladder up
LADDER = {
    "coalesced": (k_matmul_naive, (32, 8), (8, 32)),
    "tiled": (k_matmul_tiled, (TILE, TILE), (TILE, TILE)),
    "1D blocking": (k_matmul_1d, (64, 8), (64, 64)),
    "2D blocking": (k_matmul_2d, (16, 16), (128, 128)),
}


def grid_for(shape, per_block):
    """(x, y) blocks covering an output of shape (rows, cols) with (rows, cols) per block."""
    return blocks_for(shape[1], per_block[1]), blocks_for(shape[0], per_block[0])


def matmul(A, B, step="2D blocking", ladder=None):
    """C = A @ B for float32 numpy matrices, with the kernel of one step of the ladder."""
    kernel, block, tile = (ladder or LADDER)[step]
    A, B = np.ascontiguousarray(A, np.float32), np.ascontiguousarray(B, np.float32)
    C = np.empty((A.shape[0], B.shape[1]), np.float32)
    launch(kernel, grid_for(C.shape, tile), block, A, B, C)
    return C


def small_ladder():
    """The same four kernels at sizes the simulator runs in seconds (tiles of 4 to 16, 16 to 64 threads)."""
    return {"coalesced": (k_matmul_naive, (8, 4), (4, 8)),
            "tiled": (tiled_kernel(8), (8, 8), (8, 8)),
            "1D blocking": (blocked_1d_kernel(16, 16, 4, 4), (16, 4), (16, 16)),
            "2D blocking": (blocked_2d_kernel(32, 32, 8, 4, 4), (8, 8), (32, 32))}
