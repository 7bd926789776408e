"""Chapter 07's checks pass on the reference kernels and reject plausible wrong kernels.

The wrong kernels below are the usual first attempts: no guard, x and y swapped, no
barrier, a halo or a partial tile forgotten. Kernels use the module-level `cuda`.
"""

import numpy as np
import pytest
from checking import expect_failure
from numba import cuda, float32

from course_lib.checks import ch07 as check
from course_lib.cuda import matmul as M
from course_lib.cuda import puzzles as P

TPB = 8
TILE = 8
POOL_BUF = TPB + 2      # shared arrays are sized by names the compiler sees as constants
CONV_BUF = TPB + 7


def test_reference_kernels_pass(capsys):
    check.map_add10(P.k_map_add10)
    check.zip_add(P.k_zip_add)
    check.guard_add10(P.k_guard_add10)
    check.map2d_add10(P.k_map2d_add10)
    check.broadcast_add(P.k_broadcast_add)
    check.blocks_add10(P.k_blocks_add10)
    check.blocks2d_add10(P.k_blocks2d_add10)
    check.block_reverse(P.k_block_reverse, P.TPB)
    check.pool3(P.k_pool3, P.TPB)
    check.conv1d(P.k_conv1d, P.TPB, P.MAX_K)
    check.matmul_naive(M.k_matmul_naive)
    assert capsys.readouterr().out.count("passed") == 11


# ---- one thread, one element -----------------------------------------------------------------

@cuda.jit
def map_plus1(a, out):
    i = cuda.threadIdx.x
    out[i] = a[i] + 1


@cuda.jit
def map_first(a, out):
    i = cuda.threadIdx.x
    out[i] = a[0] + 10


@pytest.mark.parametrize("wrong, hint", [(map_plus1, "adds 10"), (map_first, "differs")])
def test_map_rejects(wrong, hint):
    expect_failure(check.map_add10, wrong, match=hint)


@cuda.jit
def zip_twice(a, b, out):
    i = cuda.threadIdx.x
    out[i] = a[i] + a[i]


@cuda.jit
def zip_sub(a, b, out):
    i = cuda.threadIdx.x
    out[i] = a[i] - b[i]


@pytest.mark.parametrize("wrong, hint", [(zip_twice, "add b"), (zip_sub, "differs")])
def test_zip_rejects(wrong, hint):
    expect_failure(check.zip_add, wrong, match=hint)


@cuda.jit
def guard_missing(a, out):
    i = cuda.threadIdx.x
    out[i] = a[i] + 10


@cuda.jit
def guard_too_strict(a, out):
    i = cuda.threadIdx.x
    if i < a.size - 1:
        out[i] = a[i] + 10


@pytest.mark.parametrize("wrong, hint", [(guard_missing, "guard the body"), (guard_too_strict, "never written")])
def test_guard_rejects(wrong, hint):
    expect_failure(check.guard_add10, wrong, match=hint)


@cuda.jit
def map2d_swapped(a, out):
    row = cuda.threadIdx.x                    # x is the column, not the row
    col = cuda.threadIdx.y
    if row < a.shape[0] and col < a.shape[1]:
        out[row, col] = a[row, col] + 10


@cuda.jit
def map2d_unguarded(a, out):
    col, row = cuda.threadIdx.x, cuda.threadIdx.y
    out[row, col] = a[row, col] + 10


@pytest.mark.parametrize("wrong, hint", [(map2d_swapped, "cuda.grid(2) returns (x, y)"),
                                         (map2d_unguarded, "guard both axes")])
def test_map2d_rejects(wrong, hint):
    expect_failure(check.map2d_add10, wrong, match=hint)


@cuda.jit
def broadcast_swapped(a, b, out):
    row, col = cuda.threadIdx.x, cuda.threadIdx.y
    if row < out.shape[0] and col < out.shape[1]:
        out[row, col] = a[row, 0] + b[0, col]


@cuda.jit
def broadcast_wrong_axes(a, b, out):
    col, row = cuda.threadIdx.x, cuda.threadIdx.y
    if row < out.shape[0] and col < out.shape[1]:
        out[row, col] = a[0, col] + b[row, 0]


@pytest.mark.parametrize("wrong, hint", [(broadcast_swapped, "cuda.grid(2)"), (broadcast_wrong_axes, "a has one column")])
def test_broadcast_rejects(wrong, hint):
    expect_failure(check.broadcast_add, wrong, match=hint)


@cuda.jit
def blocks_no_offset(a, out):
    i = cuda.threadIdx.x
    if i < a.size:
        out[i] = a[i] + 10


@cuda.jit
def blocks_unguarded(a, out):
    i = cuda.grid(1)
    out[i] = a[i] + 10


@cuda.jit
def blocks_assume_8(a, out):
    i = cuda.blockIdx.x * 8 + cuda.threadIdx.x      # the block size written as a number
    if i < a.size:
        out[i] = a[i] + 10


@pytest.mark.parametrize("wrong, hint", [(blocks_no_offset, "every block covers its own chunk"), (blocks_unguarded, "guard"),
                                         (blocks_assume_8, "never write it as a number")])
def test_blocks_rejects(wrong, hint):
    expect_failure(check.blocks_add10, wrong, match=hint)


@cuda.jit
def blocks2d_swapped(a, out):
    row, col = cuda.grid(2)
    if row < a.shape[0] and col < a.shape[1]:
        out[row, col] = a[row, col] + 10


@cuda.jit
def blocks2d_unguarded(a, out):
    col, row = cuda.grid(2)
    out[row, col] = a[row, col] + 10


@cuda.jit
def blocks2d_assume_square(a, out):
    col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    row = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.y     # blockDim.x for y: square blocks only
    if row < a.shape[0] and col < a.shape[1]:
        out[row, col] = a[row, col] + 10


@cuda.jit
def blocks2d_assume_4x4(a, out):
    col = cuda.blockIdx.x * 4 + cuda.threadIdx.x
    row = cuda.blockIdx.y * 4 + cuda.threadIdx.y
    if row < a.shape[0] and col < a.shape[1]:
        out[row, col] = a[row, col] + 10


@pytest.mark.parametrize("wrong, hint", [(blocks2d_swapped, "cuda.grid(2) returns (x, y)"),
                                         (blocks2d_unguarded, "guard both axes"),
                                         (blocks2d_assume_square, "not always square"),
                                         (blocks2d_assume_4x4, "not always square")])
def test_blocks2d_rejects(wrong, hint):
    expect_failure(check.blocks2d_add10, wrong, match=hint)


# ---- shared memory: missing barriers, halos, partial blocks ----------------------------------

@cuda.jit
def reverse_no_sync(a, out):
    t = cuda.threadIdx.x
    start = cuda.blockIdx.x * TPB
    buf = cuda.shared.array(TPB, float32)
    if start + t < a.size:
        buf[t] = a[start + t]
    n = min(TPB, a.size - start)
    if t < n:
        out[start + t] = buf[n - 1 - t]


@cuda.jit
def reverse_full_blocks(a, out):
    t = cuda.threadIdx.x
    start = cuda.blockIdx.x * TPB
    buf = cuda.shared.array(TPB, a.dtype)
    if start + t < a.size:
        buf[t] = a[start + t]
    cuda.syncthreads()
    if start + t < a.size:
        out[start + t] = buf[TPB - 1 - t]


@pytest.mark.parametrize("wrong, hint", [(reverse_no_sync, "race"), (reverse_full_blocks, "the last block holds only")])
def test_block_reverse_rejects(wrong, hint):
    expect_failure(check.block_reverse, wrong, TPB, match=hint)


@cuda.jit
def pool_no_sync(a, out):
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * TPB + t
    buf = cuda.shared.array(POOL_BUF, a.dtype)
    if i < a.size:
        buf[t + 2] = a[i]
    if t < 2:
        buf[t] = a[i - 2] if i >= 2 else 0.0
    if i < a.size:
        out[i] = buf[t] + buf[t + 1] + buf[t + 2]


@cuda.jit
def pool_no_halo(a, out):
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * TPB + t
    buf = cuda.shared.array(POOL_BUF, a.dtype)
    if i < a.size:
        buf[t + 2] = a[i]
    if t < 2:
        buf[t] = 0.0
    cuda.syncthreads()
    if i < a.size:
        out[i] = buf[t] + buf[t + 1] + buf[t + 2]


@cuda.jit
def pool_global_wrap(a, out):
    i = cuda.grid(1)
    if i < a.size:
        out[i] = a[i - 2] + a[i - 1] + a[i]       # a[-1] wraps on the simulator


@cuda.jit
def pool_sized_by_expression(a, out):
    """Right values on the simulator, but a GPU's compiler refuses a shared array sized `TPB + 2`."""
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * TPB + t
    buf = cuda.shared.array(TPB + 2, a.dtype)
    if i < a.size:
        buf[t + 2] = a[i]
    if t < 2:
        buf[t] = a[i - 2] if i >= 2 else 0.0
    cuda.syncthreads()
    if i < a.size:
        out[i] = buf[t] + buf[t + 1] + buf[t + 2]


@pytest.mark.parametrize("wrong, hint", [(pool_no_sync, "race"), (pool_no_halo, "halo"), (pool_global_wrap, "wrapped"),
                                         (pool_sized_by_expression, "sizes an array with an expression")])
def test_pool_rejects(wrong, hint):
    expect_failure(check.pool3, wrong, TPB, match=hint)


@cuda.jit
def dot_no_sync(a, b, partial):
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    buf = cuda.shared.array(TPB, a.dtype)
    buf[t] = a[i] * b[i] if i < a.size else 0.0
    step = TPB // 2
    while step > 0:
        if t < step:
            buf[t] += buf[t + step]
        step //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = buf[0]


@cuda.jit
def dot_unguarded(a, b, partial):
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    buf = cuda.shared.array(TPB, a.dtype)
    buf[t] = a[i] * b[i]
    cuda.syncthreads()
    step = TPB // 2
    while step > 0:
        if t < step:
            buf[t] += buf[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = buf[0]


@cuda.jit
def dot_one_level(a, b, partial):
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    buf = cuda.shared.array(TPB, a.dtype)
    buf[t] = a[i] * b[i] if i < a.size else 0.0
    cuda.syncthreads()
    if t == 0:
        partial[cuda.blockIdx.x] = buf[0] + buf[1]


@pytest.mark.parametrize("wrong, hint", [(dot_no_sync, "race"), (dot_unguarded, "outside an array"),
                                         (dot_one_level, None)])
def test_dot_rejects(wrong, hint):
    expect_failure(check.dot_partial, wrong, TPB, match=hint)


@cuda.jit
def conv_no_halo(a, w, out):
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * TPB + t
    tile = cuda.shared.array(CONV_BUF, a.dtype)
    tile[t] = a[i] if i < a.size else 0.0
    if t < w.size - 1:
        tile[t + TPB] = 0.0
    cuda.syncthreads()
    if i < a.size:
        acc = 0.0
        for k in range(w.size):
            acc += tile[t + k] * w[k]
        out[i] = acc


@cuda.jit
def conv_flipped(a, w, out):
    i = cuda.grid(1)
    if i < a.size:
        acc = 0.0
        for k in range(w.size):
            if i + k < a.size:
                acc += a[i + k] * w[w.size - 1 - k]
        out[i] = acc


@pytest.mark.parametrize("wrong, hint", [(conv_no_halo, "halo"), (conv_flipped, "flipped")])
def test_conv_rejects(wrong, hint):
    expect_failure(check.conv1d, wrong, TPB, 8, match=hint)


@cuda.jit
def scan_race(a, out, sums):
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    buf = cuda.shared.array(TPB, a.dtype)
    buf[t] = a[i] if i < a.size else 0.0
    cuda.syncthreads()
    step = 1
    while step < TPB:
        if t >= step:
            buf[t] += buf[t - step]             # reads a neighbour that may already be updated
        cuda.syncthreads()
        step *= 2
    if i < a.size:
        out[i] = buf[t]
    if t == TPB - 1:
        sums[cuda.blockIdx.x] = buf[t]


@cuda.jit
def scan_exclusive(a, out, sums):
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    buf = cuda.shared.array(TPB, a.dtype)
    buf[t] = a[i] if i < a.size else 0.0
    cuda.syncthreads()
    step = 1
    while step < TPB:
        v = buf[t - step] if t >= step else 0.0
        cuda.syncthreads()
        buf[t] += v
        cuda.syncthreads()
        step *= 2
    if i < a.size:
        out[i] = buf[t] - a[i]
    if t == TPB - 1:
        sums[cuda.blockIdx.x] = buf[t]


@pytest.mark.parametrize("wrong, hint", [(scan_race, "race"), (scan_exclusive, "exclusive")])
def test_block_scan_rejects(wrong, hint):
    expect_failure(check.block_scan, wrong, TPB, match=hint)


@cuda.jit
def rowsum_first_cols(a, out):
    t = cuda.threadIdx.x
    row = cuda.blockIdx.x
    buf = cuda.shared.array(TPB, a.dtype)
    buf[t] = a[row, t] if t < a.shape[1] else 0.0
    cuda.syncthreads()
    if t == 0:
        acc = 0.0
        for j in range(TPB):
            acc += buf[j]
        out[row] = acc


@cuda.jit
def rowsum_no_sync(a, out):
    t = cuda.threadIdx.x
    row = cuda.blockIdx.x
    buf = cuda.shared.array(TPB, a.dtype)
    acc = 0.0
    for col in range(t, a.shape[1], TPB):
        acc += a[row, col]
    buf[t] = acc
    if t == 0:
        total = 0.0
        for j in range(TPB):
            total += buf[j]
        out[row] = total


@pytest.mark.parametrize("wrong, hint", [(rowsum_first_cols, "first tpb columns"), (rowsum_no_sync, "race")])
def test_row_sum_rejects(wrong, hint):
    expect_failure(check.row_sum, wrong, TPB, match=hint)


# ---- matmul --------------------------------------------------------------------------------

@cuda.jit
def matmul_swapped(A, B, C):
    row, col = cuda.grid(2)
    if row < C.shape[0] and col < C.shape[1]:
        acc = 0.0
        for k in range(A.shape[1]):
            acc += A[row, k] * B[k, col]
        C[row, col] = acc


@cuda.jit
def matmul_short_k(A, B, C):
    col, row = cuda.grid(2)
    if row < C.shape[0] and col < C.shape[1]:
        acc = 0.0
        for k in range(A.shape[1] - 1):
            acc += A[row, k] * B[k, col]
        C[row, col] = acc


@cuda.jit
def matmul_assume_square(A, B, C):
    col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    row = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.y     # blockDim.x for y: square blocks only
    if row < C.shape[0] and col < C.shape[1]:
        acc = 0.0
        for k in range(A.shape[1]):
            acc += A[row, k] * B[k, col]
        C[row, col] = acc


@pytest.mark.parametrize("wrong, hint", [(matmul_swapped, "cuda.grid(2)"), (matmul_short_k, "stops one short"),
                                         (matmul_assume_square, "not always square")])
def test_matmul_naive_rejects(wrong, hint):
    expect_failure(check.matmul_naive, wrong, match=hint)


def tiled(drop_last=False, second_sync=True, guard_loads=True):
    """Variants of the tiled kernel with one planted mistake each."""
    @cuda.jit
    def kernel(A, B, C):
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        col, row = cuda.grid(2)
        sA = cuda.shared.array((TILE, TILE), float32)
        sB = cuda.shared.array((TILE, TILE), float32)
        K = A.shape[1]
        acc = float32(0.0)
        tiles = K // TILE if drop_last else (K + TILE - 1) // TILE
        for t in range(tiles):
            k = t * TILE
            if guard_loads:
                sA[ty, tx] = A[row, k + tx] if row < A.shape[0] and k + tx < K else 0.0
                sB[ty, tx] = B[k + ty, col] if k + ty < K and col < B.shape[1] else 0.0
            else:
                sA[ty, tx] = A[row, k + tx]
                sB[ty, tx] = B[k + ty, col]
            cuda.syncthreads()
            for j in range(TILE):
                acc += sA[ty, j] * sB[j, tx]
            if second_sync:
                cuda.syncthreads()
        if row < C.shape[0] and col < C.shape[1]:
            C[row, col] = acc
    return kernel


def test_tiled_reference_passes(capsys):
    check.matmul_tiled(tiled(), TILE)
    assert "passed" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, hint", [(tiled(drop_last=True), "partial tile"),
                                         (tiled(guard_loads=False), "outside an array"),
                                         (tiled(second_sync=False), "race")])
def test_matmul_tiled_rejects(wrong, hint):
    expect_failure(check.matmul_tiled, wrong, TILE, match=hint)


def test_stub_is_reported_as_not_implemented():
    @cuda.jit
    def stub(a, out):
        raise NotImplementedError("Exercise: replace this line with your code")

    expect_failure(check.map_add10, stub, match="not implemented yet")


def test_oversized_block_is_refused():
    @cuda.jit
    def fine(a, out):
        i = cuda.grid(1)
        if i < a.size:
            out[i] = a[i] + 10
    # The check launches 8-thread blocks, so a correct kernel passes; the launcher refuses
    # blocks a GPU would refuse (tested in test_ch07_cuda.py).
    check.blocks_add10(fine)


# ---- the goal pictures under the exercise stubs ---------------------------------------------------

EXERCISES = ["map_add10", "zip_add", "guard_add10", "map2d_add10", "broadcast_add", "blocks_add10",
             "blocks2d_add10", "block_reverse", "pool3", "dot_partial", "conv1d", "block_scan", "row_sum",
             "matmul_naive", "matmul_tiled"]


def test_every_goal_picture_traces_a_reference_that_writes_every_output():
    """Each exercise's picture comes from the library's kernel, traced at the exercise's sizes
    (TPB, TILE = 8); that trace must fill every output the picture shows."""
    from course_lib.cuda.goals import _goals, goal_kernel
    from course_lib.cuda.trace import trace

    goals = _goals(TPB, TILE)
    assert list(goals) == EXERCISES
    for name, (grid, block, arrays, _) in goals.items():
        t = trace(goal_kernel(name, TPB, TILE), grid, block, **arrays)
        for key, before in arrays.items():
            if np.isnan(before).all():
                assert not np.isnan(t.arrays[key]).any(), f"{name}: {key} not fully written"
