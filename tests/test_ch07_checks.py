"""Chapter 07's checks pass on the reference kernels and reject plausible wrong kernels.

The wrong kernels below are the usual first attempts: no guard, x and y swapped, no
barrier, a halo or a partial tile forgotten. Kernels use the module-level `cuda`.
"""

import numpy as np
import pytest
from checking import expect_failure
from edits import edited
from numba import cuda

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
# Each wrong kernel is the library's puzzle kernel with one mistake edited in (tests/edits.py),
# compiled with the tests' block size: TPB = 8 threads, and the shared-array sizes that follow.

SMALL = {"TPB": TPB, "POOL_BUF": POOL_BUF, "CONV_BUF": CONV_BUF, "TILE": TILE}


def wrong(reference, name, *changes):
    return edited(reference, name, *changes, env=SMALL)


def unguarded(kernel, name, guard):
    """The kernel with its `if guard:` removed, the body run by every thread."""
    return wrong(kernel, name, (f"if {guard}:\n        ", ""))


map_plus1 = wrong(P.k_map_add10, "map_plus1", ("a[i] + 10", "a[i] + 1"))
map_first = wrong(P.k_map_add10, "map_first", ("a[i] + 10", "a[0] + 10"))


@pytest.mark.parametrize("wrong, hint", [(map_plus1, "adds 10"), (map_first, "differs")])
def test_map_rejects(wrong, hint):
    expect_failure(check.map_add10, wrong, match=hint)


zip_twice = wrong(P.k_zip_add, "zip_twice", ("a[i] + b[i]", "a[i] + a[i]"))
zip_sub = wrong(P.k_zip_add, "zip_sub", ("a[i] + b[i]", "a[i] - b[i]"))


@pytest.mark.parametrize("wrong, hint", [(zip_twice, "add b"), (zip_sub, "differs")])
def test_zip_rejects(wrong, hint):
    expect_failure(check.zip_add, wrong, match=hint)


guard_missing = unguarded(P.k_guard_add10, "guard_missing", "i < a.size")
guard_too_strict = wrong(P.k_guard_add10, "guard_too_strict", ("i < a.size", "i < a.size - 1"))


@pytest.mark.parametrize("wrong, hint", [(guard_missing, "guard the body"), (guard_too_strict, "never written")])
def test_guard_rejects(wrong, hint):
    expect_failure(check.guard_add10, wrong, match=hint)


X_IS_ROW = (("col = cuda.threadIdx.x", "col = cuda.threadIdx.y"), ("row = cuda.threadIdx.y", "row = cuda.threadIdx.x"))
map2d_swapped = wrong(P.k_map2d_add10, "map2d_swapped", *X_IS_ROW)
map2d_unguarded = unguarded(P.k_map2d_add10, "map2d_unguarded", "row < a.shape[0] and col < a.shape[1]")


@pytest.mark.parametrize("wrong, hint", [(map2d_swapped, "cuda.grid(2) returns (x, y)"),
                                         (map2d_unguarded, "guard both axes")])
def test_map2d_rejects(wrong, hint):
    expect_failure(check.map2d_add10, wrong, match=hint)


broadcast_swapped = wrong(P.k_broadcast_add, "broadcast_swapped", *X_IS_ROW)
broadcast_wrong_axes = wrong(P.k_broadcast_add, "broadcast_wrong_axes", ("a[row, 0] + b[0, col]", "a[0, col] + b[row, 0]"))


@pytest.mark.parametrize("wrong, hint", [(broadcast_swapped, "cuda.grid(2)"), (broadcast_wrong_axes, "a has one column")])
def test_broadcast_rejects(wrong, hint):
    expect_failure(check.broadcast_add, wrong, match=hint)


GLOBAL_INDEX = "cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x"
blocks_no_offset = wrong(P.k_blocks_add10, "blocks_no_offset", (GLOBAL_INDEX, "cuda.threadIdx.x"))
blocks_unguarded = unguarded(P.k_blocks_add10, "blocks_unguarded", "i < a.size")
blocks_assume_8 = wrong(P.k_blocks_add10, "blocks_assume_8", (GLOBAL_INDEX, "cuda.blockIdx.x * 8 + cuda.threadIdx.x"))


@pytest.mark.parametrize("wrong, hint", [(blocks_no_offset, "every block covers its own chunk"), (blocks_unguarded, "guard"),
                                         (blocks_assume_8, "never write it as a number")])
def test_blocks_rejects(wrong, hint):
    expect_failure(check.blocks_add10, wrong, match=hint)


def grid2d(x_step, y_step):
    """cuda.grid(2) written out, with the block's extent along x and y as given."""
    return (f"(cuda.blockIdx.x * {x_step} + cuda.threadIdx.x, "
            f"cuda.blockIdx.y * {y_step} + cuda.threadIdx.y)")


blocks2d_swapped = wrong(P.k_blocks2d_add10, "blocks2d_swapped", ("col, row = cuda.grid(2)", "row, col = cuda.grid(2)"))
blocks2d_unguarded = unguarded(P.k_blocks2d_add10, "blocks2d_unguarded", "row < a.shape[0] and col < a.shape[1]")
# blockDim.x for y: square blocks only
blocks2d_assume_square = wrong(P.k_blocks2d_add10, "blocks2d_assume_square",
                               ("cuda.grid(2)", grid2d("cuda.blockDim.x", "cuda.blockDim.x")))
blocks2d_assume_4x4 = wrong(P.k_blocks2d_add10, "blocks2d_assume_4x4", ("cuda.grid(2)", grid2d(4, 4)))


@pytest.mark.parametrize("wrong, hint", [(blocks2d_swapped, "cuda.grid(2) returns (x, y)"),
                                         (blocks2d_unguarded, "guard both axes"),
                                         (blocks2d_assume_square, "not always square"),
                                         (blocks2d_assume_4x4, "not always square")])
def test_blocks2d_rejects(wrong, hint):
    expect_failure(check.blocks2d_add10, wrong, match=hint)


# ---- shared memory: missing barriers, halos, partial blocks ----------------------------------

def no_sync(kernel, name, count=1, after=""):
    """The kernel without its barrier(s): `count` of them, or the one written after `after`."""
    return wrong(kernel, name, (f"{after}cuda.syncthreads()", f"{after}pass", count))


reverse_no_sync = no_sync(P.k_block_reverse, "reverse_no_sync")
reverse_full_blocks = wrong(P.k_block_reverse, "reverse_full_blocks", ("buf[n - 1 - t]", "buf[TPB - 1 - t]"))


@pytest.mark.parametrize("wrong, hint", [(reverse_no_sync, "race"), (reverse_full_blocks, "the last block holds only")])
def test_block_reverse_rejects(wrong, hint):
    expect_failure(check.block_reverse, wrong, TPB, match=hint)


@cuda.jit
def pool_global_wrap(a, out):
    i = cuda.grid(1)
    if i < a.size:
        out[i] = a[i - 2] + a[i - 1] + a[i]       # a[-1] wraps on the simulator


pool_no_sync = no_sync(P.k_pool3, "pool_no_sync")
pool_no_halo = wrong(P.k_pool3, "pool_no_halo", ("buf[t] = a[j] if j >= 0 else 0.0", "buf[t] = 0.0"))
# right values on the simulator, but a GPU's compiler refuses a shared array sized `TPB + 2`
pool_sized_by_expression = wrong(P.k_pool3, "pool_sized_by_expression", ("array(POOL_BUF,", "array(TPB + 2,"))


@pytest.mark.parametrize("wrong, hint", [(pool_no_sync, "race"), (pool_no_halo, "halo"), (pool_global_wrap, "wrapped"),
                                         (pool_sized_by_expression, "sizes an array with an expression")])
def test_pool_rejects(wrong, hint):
    expect_failure(check.pool3, wrong, TPB, match=hint)


dot_no_sync = no_sync(P.k_dot_partial, "dot_no_sync", count=2)
dot_unguarded = wrong(P.k_dot_partial, "dot_unguarded", ("a[i] * b[i] if i < a.size else 0.0", "a[i] * b[i]"))
dot_one_level = wrong(P.k_dot_partial, "dot_one_level", ("step = TPB // 2", "step = 1"))   # the tree's last level only


@pytest.mark.parametrize("wrong, hint", [(dot_no_sync, "race"), (dot_unguarded, "outside an array"),
                                         (dot_one_level, None)])
def test_dot_rejects(wrong, hint):
    expect_failure(check.dot_partial, wrong, TPB, match=hint)


conv_no_halo = wrong(P.k_conv1d, "conv_no_halo", ("tile[t + TPB] = a[j] if j < a.size else 0.0", "tile[t + TPB] = 0.0"))
conv_flipped = wrong(P.k_conv1d, "conv_flipped", ("* ws[k]", "* ws[K - 1 - k]"))


@pytest.mark.parametrize("wrong, hint", [(conv_no_halo, "halo"), (conv_flipped, "flipped")])
def test_conv_rejects(wrong, hint):
    expect_failure(check.conv1d, wrong, TPB, 8, match=hint)


# reads a neighbour that may already be updated: no barrier between the reads and the writes
scan_race = no_sync(P.k_block_scan, "scan_race", after="# read everything first ...\n        ")
scan_exclusive = wrong(P.k_block_scan, "scan_exclusive", ("out[i] = buf[t]", "out[i] = buf[t] - a[i]"))


@pytest.mark.parametrize("wrong, hint", [(scan_race, "race"), (scan_exclusive, "exclusive")])
def test_block_scan_rejects(wrong, hint):
    expect_failure(check.block_scan, wrong, TPB, match=hint)


rowsum_first_cols = wrong(P.k_row_sum, "rowsum_first_cols", ("range(t, a.shape[1], TPB)", "range(t, min(a.shape[1], TPB), TPB)"))
rowsum_no_sync = no_sync(P.k_row_sum, "rowsum_no_sync", after="buf[t] = acc\n    ")


@pytest.mark.parametrize("wrong, hint", [(rowsum_first_cols, "first tpb columns"), (rowsum_no_sync, "race")])
def test_row_sum_rejects(wrong, hint):
    expect_failure(check.row_sum, wrong, TPB, match=hint)


# ---- matmul --------------------------------------------------------------------------------

matmul_swapped = wrong(M.k_matmul_naive, "matmul_swapped", ("col, row = cuda.grid(2)", "row, col = cuda.grid(2)"))
matmul_short_k = wrong(M.k_matmul_naive, "matmul_short_k", ("range(A.shape[1])", "range(A.shape[1] - 1)"))
matmul_assume_square = wrong(M.k_matmul_naive, "matmul_assume_square",
                             ("cuda.grid(2)", grid2d("cuda.blockDim.x", "cuda.blockDim.x")))


@pytest.mark.parametrize("wrong, hint", [(matmul_swapped, "cuda.grid(2)"), (matmul_short_k, "stops one short"),
                                         (matmul_assume_square, "not always square")])
def test_matmul_naive_rejects(wrong, hint):
    expect_failure(check.matmul_naive, wrong, match=hint)


tiled = wrong(M.k_matmul_tiled, "tiled")        # the library's kernel, at the tests' TILE = 8
tiled_drop_last = wrong(M.k_matmul_tiled, "tiled_drop_last", ("range((K + TILE - 1) // TILE)", "range(K // TILE)"))
tiled_unguarded_loads = wrong(M.k_matmul_tiled, "tiled_unguarded_loads",
                              (" if row < A.shape[0] and k + tx < K else 0.0", ""),
                              (" if k + ty < K and col < B.shape[1] else 0.0", ""))
tiled_one_sync = no_sync(M.k_matmul_tiled, "tiled_one_sync", after="acc += sA[ty, j] * sB[j, tx]\n        ")


def test_tiled_reference_passes(capsys):
    check.matmul_tiled(tiled, TILE)
    assert "passed" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, hint", [(tiled_drop_last, "partial tile"),
                                         (tiled_unguarded_loads, "outside an array"),
                                         (tiled_one_sync, "race")])
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
