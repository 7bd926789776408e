"""The course's answers to the CUDA puzzles of chapter 07 (exercises 07.1 to 07.13), each with a host function.

Read a kernel here once its check passes: each one's docstring says which exercise it answers.

Every kernel reads `cuda` from the module-level `numba.cuda`, so the same code runs on
Numba's simulator and on a GPU. Shared-array sizes must be compile-time constants: a number
or a module-level name, never an expression inside the kernel (`TPB + 2` runs on the
simulator, but a GPU's compiler refuses it). Hence TPB (threads per block) and the sizes
derived from it, named here once.
Each host function (no leading `k_`) launches its kernel on numpy arrays and returns the
result; tests compare them with numpy.
"""

import math

import numpy as np
from numba import cuda

from course_lib.cuda.launch import blocks_for, launch

TPB = 32        # threads per block of the shared-memory kernels (a warp)
MAX_K = 8       # longest 1-D convolution kernel
POOL_BUF = TPB + 2            # pool3's shared array: a 2-element halo, then the block's chunk
CONV_BUF = TPB + MAX_K - 1    # conv1d's: the block's chunk, then a right halo of up to MAX_K - 1


# 1. map: one thread per element, exactly as many threads as elements.
@cuda.jit
def k_map_add10(a, out):
    """The course's answer to exercise 07.1 (`map_add10`): read it once your check passes."""
    i = cuda.threadIdx.x
    out[i] = a[i] + 10


def map_add10(a):
    out = np.empty_like(a)
    launch(k_map_add10, 1, a.size, a, out)
    return out


# 2. zip: two inputs, one output.
@cuda.jit
def k_zip_add(a, b, out):
    """The course's answer to exercise 07.2 (`zip_add`): read it once your check passes."""
    i = cuda.threadIdx.x
    out[i] = a[i] + b[i]


def zip_add(a, b):
    out = np.empty_like(a)
    launch(k_zip_add, 1, a.size, a, b, out)
    return out


# 3. guard: more threads than elements; the extra threads must do nothing.
@cuda.jit
def k_guard_add10(a, out):
    """The course's answer to exercise 07.3 (`guard_add10`): read it once your check passes."""
    i = cuda.threadIdx.x
    if i < a.size:
        out[i] = a[i] + 10


def guard_add10(a, threads=None):
    out = np.empty_like(a)
    launch(k_guard_add10, 1, threads or blocks_for(a.size, 32) * 32, a, out)
    return out


# 4. 2-D map: x runs along columns (the fast, contiguous axis), y along rows.
@cuda.jit
def k_map2d_add10(a, out):
    """The course's answer to exercise 07.4 (`map2d_add10`): read it once your check passes."""
    row = cuda.threadIdx.y
    col = cuda.threadIdx.x
    if row < a.shape[0] and col < a.shape[1]:
        out[row, col] = a[row, col] + 10


def map2d_add10(a):
    out = np.empty_like(a)
    launch(k_map2d_add10, 1, (a.shape[1] + 2, a.shape[0] + 1), a, out)
    return out


# 5. broadcast: a column (n, 1) plus a row (1, m) gives an (n, m) table.
@cuda.jit
def k_broadcast_add(a, b, out):
    """The course's answer to exercise 07.5 (`broadcast_add`): read it once your check passes."""
    col = cuda.threadIdx.x
    row = cuda.threadIdx.y
    if row < out.shape[0] and col < out.shape[1]:
        out[row, col] = a[row, 0] + b[0, col]


def broadcast_add(a, b):
    out = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
    launch(k_broadcast_add, 1, (out.shape[1] + 1, out.shape[0] + 2), a, b, out)
    return out


# 6. blocks: many blocks; a thread's global index is blockIdx * blockDim + threadIdx.
@cuda.jit
def k_blocks_add10(a, out):
    """The course's answer to exercise 07.6 (`blocks_add10`): read it once your check passes."""
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x   # what cuda.grid(1) returns
    if i < a.size:
        out[i] = a[i] + 10


def blocks_add10(a, tpb=8):
    out = np.empty_like(a)
    launch(k_blocks_add10, blocks_for(a.size, tpb), tpb, a, out)
    return out


# 7. 2-D blocks: cuda.grid(2) gives (x, y) = (column, row).
@cuda.jit
def k_blocks2d_add10(a, out):
    """The course's answer to exercise 07.7 (`blocks2d_add10`): read it once your check passes."""
    col, row = cuda.grid(2)
    if row < a.shape[0] and col < a.shape[1]:
        out[row, col] = a[row, col] + 10


def blocks2d_add10(a, block=(8, 4)):
    out = np.empty_like(a)
    grid = (blocks_for(a.shape[1], block[0]), blocks_for(a.shape[0], block[1]))
    launch(k_blocks2d_add10, grid, block, a, out)
    return out


# 8. shared memory: each block reverses its own chunk through a shared buffer.
#    Thread t writes slot t, then reads slot (last - t), written by ANOTHER thread:
#    the barrier in between is what makes that read safe.
@cuda.jit
def k_block_reverse(a, out):
    """The course's answer to exercise 07.8 (`block_reverse`): read it once your check passes."""
    t = cuda.threadIdx.x
    start = cuda.blockIdx.x * TPB
    i = start + t
    buf = cuda.shared.array(TPB, a.dtype)
    if i < a.size:
        buf[t] = a[i]
    cuda.syncthreads()
    n = min(TPB, a.size - start)          # the last block may be partial
    if t < n:
        out[i] = buf[n - 1 - t]


def block_reverse(a):
    out = np.empty_like(a)
    launch(k_block_reverse, blocks_for(a.size, TPB), TPB, a, out)
    return out


# 9. pooling: out[i] = a[i-2] + a[i-1] + a[i] (missing terms count 0), read from shared
#    memory with a halo of 2 elements loaded from the previous block's range.
@cuda.jit
def k_pool3(a, out):
    """The course's answer to exercise 07.9 (`pool3`): read it once your check passes."""
    buf = cuda.shared.array(POOL_BUF, a.dtype)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * TPB + t
    if i < a.size:
        buf[t + 2] = a[i]
    if t < 2:                              # two threads also load the halo
        j = i - 2
        buf[t] = a[j] if j >= 0 else 0.0   # never index a[-1]: it would wrap silently
    cuda.syncthreads()
    if i < a.size:
        out[i] = buf[t] + buf[t + 1] + buf[t + 2]


def pool3(a):
    out = np.empty_like(a)
    launch(k_pool3, blocks_for(a.size, TPB), TPB, a, out)
    return out


# 10. dot product: each block multiplies its chunk and sums it by a tree reduction
#     in shared memory: TPB/2 partial sums, then TPB/4, ... with a barrier per level.
@cuda.jit
def k_dot_partial(a, b, partial):
    """The course's answer to exercise 07.10 (`dot_partial`): read it once your check passes."""
    buf = cuda.shared.array(TPB, a.dtype)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    buf[t] = a[i] * b[i] if i < a.size else 0.0
    cuda.syncthreads()
    step = TPB // 2
    while step > 0:
        if t < step:
            buf[t] += buf[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = buf[0]


def dot(a, b):
    partial = np.empty(blocks_for(a.size, TPB), dtype=a.dtype)
    launch(k_dot_partial, partial.size, TPB, a, b, partial)
    return partial.sum()                   # a handful of block sums: add them on the host


# 11. 1-D convolution: out[i] = sum_k a[i + k] * w[k] (a is 0 past its end).
#     A block loads its TPB elements plus a right halo of K-1, and the weights.
@cuda.jit
def k_conv1d(a, w, out):
    """The course's answer to exercise 07.11 (`conv1d`): read it once your check passes."""
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * TPB + t
    K = w.size
    tile = cuda.shared.array(CONV_BUF, a.dtype)
    ws = cuda.shared.array(MAX_K, a.dtype)
    tile[t] = a[i] if i < a.size else 0.0
    if t < K - 1:
        j = i + TPB
        tile[t + TPB] = a[j] if j < a.size else 0.0
    if t < K:
        ws[t] = w[t]
    cuda.syncthreads()
    if i < a.size:
        acc = 0.0
        for k in range(K):
            acc += tile[t + k] * ws[k]
        out[i] = acc


def conv1d(a, w):
    assert w.size <= MAX_K, f"the kernel holds at most MAX_K={MAX_K} weights"
    out = np.empty_like(a)
    launch(k_conv1d, blocks_for(a.size, TPB), TPB, a, w, out)
    return out


# 12. prefix sum (inclusive): a Hillis-Steele scan inside each block, then a second
#     pass that adds to every block the total of the blocks before it.
@cuda.jit
def k_block_scan(a, out, block_sums):
    """The course's answer to exercise 07.12 (`block_scan`): read it once your check passes."""
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    buf = cuda.shared.array(TPB, a.dtype)
    buf[t] = a[i] if i < a.size else 0.0
    cuda.syncthreads()
    step = 1
    while step < TPB:
        v = buf[t - step] if t >= step else 0.0    # read everything first ...
        cuda.syncthreads()
        buf[t] += v                                # ... then write
        cuda.syncthreads()
        step *= 2
    if i < a.size:
        out[i] = buf[t]
    if t == TPB - 1:
        block_sums[cuda.blockIdx.x] = buf[t]


@cuda.jit
def k_add_offsets(out, offsets):
    i = cuda.grid(1)
    b = cuda.blockIdx.x
    if i < out.size and b > 0:
        out[i] += offsets[b - 1]


def prefix_sum(a, block_scan=k_block_scan):
    """Inclusive scan of any length: block scans, a scan of the block totals, then offsets."""
    nb = blocks_for(a.size, TPB)
    out, sums = np.empty_like(a), np.empty(nb, dtype=a.dtype)
    launch(block_scan, nb, TPB, a, out, sums)
    if nb > 1:
        offsets = prefix_sum(sums, block_scan)      # the block totals, scanned the same way
        launch(k_add_offsets, nb, TPB, out, offsets)
    return out


# 13. axis sum: one block per row; threads stride over the columns, then reduce.
@cuda.jit
def k_row_sum(a, out):
    """The course's answer to exercise 07.13 (`row_sum`): read it once your check passes."""
    t = cuda.threadIdx.x
    row = cuda.blockIdx.x
    buf = cuda.shared.array(TPB, a.dtype)
    acc = 0.0
    for col in range(t, a.shape[1], TPB):  # consecutive threads read consecutive columns
        acc += a[row, col]
    buf[t] = acc
    cuda.syncthreads()
    step = TPB // 2
    while step > 0:
        if t < step:
            buf[t] += buf[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        out[row] = buf[0]


def row_sum(a):
    out = np.empty(a.shape[0], dtype=a.dtype)
    launch(k_row_sum, a.shape[0], TPB, a, out)
    return out


assert TPB & (TPB - 1) == 0 and math.log2(TPB) >= 1, "the tree reductions need TPB a power of two"
