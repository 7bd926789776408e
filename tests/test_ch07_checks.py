"""Chapter 07's checks pass on the reference kernels and reject plausible wrong kernels.

The wrong kernels below are the usual first attempts: no guard, x and y swapped, no
barrier, a halo or a partial tile forgotten. Kernels use the module-level `cuda`.
"""

import numpy as np
import pytest
from checking import expect_failure, expect_pass
from edits import edited
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


@pytest.mark.parametrize("wrong, hint", [(zip_twice, "adds b"), (zip_sub, "differs")])
def test_zip_rejects(wrong, hint):
    expect_failure(check.zip_add, wrong, match=hint)


guard_missing = unguarded(P.k_guard_add10, "guard_missing", "i < a.size")
guard_too_strict = wrong(P.k_guard_add10, "guard_too_strict", ("i < a.size", "i < a.size - 1"))


@pytest.mark.parametrize("wrong, hint", [(guard_missing, "past the end"), (guard_too_strict, "never written")])
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


@pytest.mark.parametrize("wrong, hint", [(blocks_no_offset, "every block covers its own chunk"),
                                         (blocks_unguarded, "past the end"),
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


@pytest.mark.parametrize("wrong, hint", [(pool_no_sync, "race"), (pool_no_halo, "halo"), (pool_global_wrap, "negative index"),
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


@cuda.jit
def matmul_column_major(A, B, C):
    """Right values for any launch that covers C, but consecutive threads walk down a column of C: every
    warp access to A and C touches as many rows as it has threads (not coalesced)."""
    x, y = cuda.grid(2)
    i = y * cuda.gridDim.x * cuda.blockDim.x + x            # the thread's number in the whole grid
    row, col = i % C.shape[0], i // C.shape[0]
    if col < C.shape[1]:
        acc = 0.0
        for k in range(A.shape[1]):
            acc += A[row, k] * B[k, col]
        C[row, col] = acc


@pytest.mark.parametrize("wrong, hint", [(matmul_swapped, "cuda.grid(2)"), (matmul_short_k, "one term short"),
                                         (matmul_assume_square, "not always square"),
                                         (matmul_column_major, "not coalesced")])
def test_matmul_naive_rejects(wrong, hint):
    expect_failure(check.matmul_naive, wrong, match=hint)


@cuda.jit
def matmul_naive_by_hand(A, B, C):
    """Correct, written differently: the indices spelled out, the sum from the last k down."""
    row = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if row >= C.shape[0] or col >= C.shape[1]:
        return
    total = float32(0.0)
    for k in range(A.shape[1] - 1, -1, -1):
        total += A[row, k] * B[k, col]
    C[row, col] = total


def test_matmul_naive_accepts_another_correct_kernel():
    expect_pass(check.matmul_naive, matmul_naive_by_hand)


# Wrong tiled kernels: the course's factory with one mistake edited in, at the tests' TILE.
def tiled_wrong(name, *changes):
    return edited(M.tiled_kernel, name, *changes)(TILE)


tiled = M.tiled_kernel(TILE)
tiled_drop_last = tiled_wrong("tiled_drop_last", ("range((K + TILE - 1) // TILE)", "range(K // TILE)"))
tiled_unguarded_loads = tiled_wrong("tiled_unguarded_loads", (" if row < A.shape[0] and k + tx < K else 0.0", ""),
                                    (" if k + ty < K and col < B.shape[1] else 0.0", ""))
tiled_one_sync = tiled_wrong("tiled_one_sync", ("acc += sA[ty, j] * sB[j, tx]\n            cuda.syncthreads()",
                                                "acc += sA[ty, j] * sB[j, tx]\n            pass"))
# right values, but every multiply-add reads its element of A from global memory: the tile of A is useless
tiled_global_a = tiled_wrong("tiled_global_a", ("acc += sA[ty, j] * sB[j, tx]",
                                                "acc += (A[row, k + j] if row < A.shape[0] and k + j < K else 0.0) * sB[j, tx]"))


def test_tiled_reference_passes(capsys):
    check.matmul_tiled(tiled, TILE)
    assert "passed" in capsys.readouterr().out


def test_tiled_accepts_another_tile_size():
    expect_pass(check.matmul_tiled, M.tiled_kernel(4), 4)


@pytest.mark.parametrize("wrong, hint", [(tiled_drop_last, "partial tile"),
                                         (tiled_unguarded_loads, "outside an array"),
                                         (tiled_one_sync, "a race"),
                                         (tiled_global_a, "from global memory")])
def test_matmul_tiled_rejects(wrong, hint):
    expect_failure(check.matmul_tiled, wrong, TILE, match=hint)


def test_a_tiled_race_names_both_threads_and_the_lines():
    message = expect_failure(check.matmul_tiled, tiled_one_sync, TILE, match="a race")
    assert "thread (" in message and "writes it at line" in message and "reads it at line" in message


# ---- 1D and 2D register blocking ---------------------------------------------------------------------

# right values, but each multiply-add reads its element of B from shared memory again
one_d_rereads = edited(M.blocked_1d_kernel, "one_d_rereads", ("b = Bs[k, tx]", "pass"),
                       ("acc[i] += As[ty * TM + i, k] * b", "acc[i] += As[ty * TM + i, k] * Bs[k, tx]"))
one_d_drop_last = edited(M.blocked_1d_kernel, "one_d_drop_last", ("for k0 in range(0, n_inner, BK):",
                                                                  "for k0 in range(0, n_inner - BK + 1, BK):"))
one_d_no_sync = edited(M.blocked_1d_kernel, "one_d_no_sync", ("acc[i] += As[ty * TM + i, k] * b\n            cuda.syncthreads()",
                                                              "acc[i] += As[ty * TM + i, k] * b\n            pass"))


@pytest.mark.parametrize("wrong, hint", [(one_d_rereads, "loads from shared memory per multiply-add"),
                                         (one_d_drop_last, "partial tile"), (one_d_no_sync, "a race")])
def test_matmul_1d_rejects(wrong, hint):
    expect_failure(check.matmul_1d, wrong, match=hint)


def blocked_1d_k_outer(BM, BN, BK, TM):
    """Correct, written differently: one A tile loaded per thread in a plain loop over rows, the registers
    filled from the B tile once per k with the i loop inside, accumulating into a local array."""
    NT = BN * (BM // TM)

    @cuda.jit
    def kernel(A, B, C):
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        me = ty * BN + tx
        top, left = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        tile_a = cuda.shared.array((BM, BK), float32)
        tile_b = cuda.shared.array((BK, BN), float32)
        out = cuda.local.array(TM, float32)
        for i in range(TM):
            out[i] = 0.0
        for k0 in range(0, A.shape[1], BK):
            e = me
            while e < BM * BK:
                r, c = e // BK, e % BK
                ok = top + r < A.shape[0] and k0 + c < A.shape[1]
                tile_a[r, c] = A[top + r, k0 + c] if ok else 0.0
                e += NT
            e = me
            while e < BK * BN:
                r, c = e // BN, e % BN
                ok = k0 + r < B.shape[0] and left + c < B.shape[1]
                tile_b[r, c] = B[k0 + r, left + c] if ok else 0.0
                e += NT
            cuda.syncthreads()
            for k in range(BK):
                x = tile_b[k, tx]
                for i in range(TM):
                    out[i] += x * tile_a[ty * TM + i, k]
            cuda.syncthreads()
        for i in range(TM):
            if top + ty * TM + i < C.shape[0] and left + tx < C.shape[1]:
                C[top + ty * TM + i, left + tx] = out[i]
    return kernel


def test_matmul_1d_accepts_the_reference_and_another_correct_kernel():
    expect_pass(check.matmul_1d, M.blocked_1d_kernel)
    expect_pass(check.matmul_1d, blocked_1d_k_outer)


# right values, but no registers: every multiply-add reads its two operands from shared memory
two_d_rereads = edited(M.blocked_2d_kernel, "two_d_rereads",
                       ("acc[i, j] += a[i] * b[j]", "acc[i, j] += As[k, ty + i * SY] * Bs[k, tx + j * SX]"))
two_d_drop_last = edited(M.blocked_2d_kernel, "two_d_drop_last", ("for k0 in range(0, K, BK):",
                                                                  "for k0 in range(0, K - BK + 1, BK):"))


def blocked_2d_contiguous(BM, BN, BK, TM, TN, transposed=True):
    """Correct, written differently: each thread owns TM consecutive rows and TN consecutive columns (the
    published SGEMM layout), A transposed in shared memory (or not: then a warp's reads of A conflict)."""
    NT = (BN // TN) * (BM // TM)
    SHAPE_A = (BK, BM) if transposed else (BM, BK)

    @cuda.jit
    def kernel(A, B, C):
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        me = ty * (BN // TN) + tx
        top, left = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        tile_a = cuda.shared.array(SHAPE_A, float32)
        tile_b = cuda.shared.array((BK, BN), float32)
        out = cuda.local.array((TM, TN), float32)
        ra = cuda.local.array(TM, float32)
        rb = cuda.local.array(TN, float32)
        for i in range(TM):
            for j in range(TN):
                out[i, j] = 0.0
        for k0 in range(0, A.shape[1], BK):
            for e in range(me, BM * BK, NT):
                r, c = e // BK, e % BK
                v = A[top + r, k0 + c] if top + r < A.shape[0] and k0 + c < A.shape[1] else 0.0
                if transposed:
                    tile_a[c, r] = v
                else:
                    tile_a[r, c] = v
            for e in range(me, BK * BN, NT):
                r, c = e // BN, e % BN
                tile_b[r, c] = B[k0 + r, left + c] if k0 + r < B.shape[0] and left + c < B.shape[1] else 0.0
            cuda.syncthreads()
            for k in range(BK):
                for i in range(TM):
                    ra[i] = tile_a[k, ty * TM + i] if transposed else tile_a[ty * TM + i, k]
                for j in range(TN):
                    rb[j] = tile_b[k, tx * TN + j]
                for i in range(TM):
                    for j in range(TN):
                        out[i, j] += ra[i] * rb[j]
            cuda.syncthreads()
        for i in range(TM):
            for j in range(TN):
                row, col = top + ty * TM + i, left + tx * TN + j
                if row < C.shape[0] and col < C.shape[1]:
                    C[row, col] = out[i, j]
    return kernel


def blocked_2d_untransposed(BM, BN, BK, TM, TN):
    return blocked_2d_contiguous(BM, BN, BK, TM, TN, transposed=False)


@pytest.mark.parametrize("wrong, hint", [(two_d_rereads, "loads from shared memory per multiply-add"),
                                         (two_d_drop_last, "partial tile"),
                                         (blocked_2d_untransposed, "conflict")])
def test_matmul_2d_rejects(wrong, hint):
    expect_failure(check.matmul_2d, wrong, match=hint)


def test_matmul_2d_accepts_the_reference_and_another_correct_kernel():
    expect_pass(check.matmul_2d, M.blocked_2d_kernel)
    expect_pass(check.matmul_2d, blocked_2d_contiguous)


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
             "matmul_naive", "matmul_tiled", "matmul_1d", "matmul_2d"]


def test_every_goal_picture_traces_a_reference_that_writes_every_output():
    """Each exercise's picture comes from the library's kernel, traced at the exercise's sizes
    (TPB, TILE = 8); that trace must fill every output the picture shows, and the tracer finds no race
    in any of the course's kernels."""
    from course_lib.cuda.goals import _goals, goal_kernel
    from course_lib.cuda.trace import trace

    goals = _goals(TPB, TILE)
    assert list(goals) == EXERCISES
    for name, (grid, block, arrays, _) in goals.items():
        t = trace(goal_kernel(name, TPB, TILE), grid, block, **arrays)
        for key, before in arrays.items():
            if np.isnan(before).all():
                assert not np.isnan(t.arrays[key]).any(), f"{name}: {key} not fully written"
        assert t.races() == [], f"{name}: the course's kernel races: {t.describe_race(t.races()[0])}"
