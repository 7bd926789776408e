"""course_lib.cuda: every kernel against numpy, the launcher's GPU limits, the tracer, the scan."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda, float32

from course_lib.cuda import LaunchError, launch
from course_lib.cuda import matmul as M
from course_lib.cuda import puzzles as P
from course_lib.cuda import scan as S
from course_lib.cuda.trace import KernelTraceError, sanitize, trace


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def test_elementwise_kernels(rng):
    a, b = rng.standard_normal(45), rng.standard_normal(45)
    m = rng.standard_normal((5, 7))
    assert np.allclose(P.map_add10(a[:13]), a[:13] + 10)
    assert np.allclose(P.zip_add(a, b), a + b)
    assert np.allclose(P.guard_add10(a), a + 10)
    assert np.allclose(P.map2d_add10(m), m + 10)
    assert np.allclose(P.broadcast_add(m[:, :1], m[:1, :]), m[:, :1] + m[:1, :])
    assert np.allclose(P.blocks_add10(a), a + 10)
    m2 = rng.standard_normal((11, 13))
    assert np.allclose(P.blocks2d_add10(m2), m2 + 10)


def test_shared_memory_kernels(rng):
    x = rng.standard_normal(75)                     # 3 blocks of 32, the last one partial
    assert np.allclose(P.block_reverse(x), np.concatenate([c[::-1] for c in np.split(x, [32, 64])]))
    pooled = x.copy()
    pooled[1:] += x[:-1]
    pooled[2:] += x[:-2]
    assert np.allclose(P.pool3(x), pooled)
    y = rng.standard_normal(75)
    assert np.isclose(P.dot(x, y), x @ y)
    w = rng.standard_normal(5)
    assert np.allclose(P.conv1d(x, w), np.convolve(np.r_[x, np.zeros(4)], w[::-1], "valid"))
    r = rng.standard_normal((3, 70))
    assert np.allclose(P.row_sum(r), r.sum(1))


def test_prefix_sum_two_levels(rng):
    a = rng.standard_normal(32 * 3 + 5)
    assert np.allclose(P.prefix_sum(a), np.cumsum(a))


@settings(max_examples=4, deadline=None)
@given(n=st.integers(1, 70), seed=st.integers(0, 2**16))
def test_prefix_sum_any_length(n, seed):
    a = np.random.default_rng(seed).standard_normal(n)
    assert np.allclose(P.prefix_sum(a), np.cumsum(a))


@pytest.mark.parametrize("m, k, n", [(19, 21, 18), (5, 3, 17)])
def test_matmuls_against_numpy(rng, m, k, n):
    A = rng.standard_normal((m, k)).astype(np.float32)
    B = rng.standard_normal((k, n)).astype(np.float32)
    ref = A.astype(np.float64) @ B
    ladder = M.small_ladder()
    for step in ladder:
        assert np.allclose(M.matmul(A, B, step, ladder), ref, atol=1e-4), step


def test_the_ladder_at_gpu_sizes_is_right_on_one_block_of_each():
    """The kernels gpu_verify times, at their own tile sizes, on shapes that are not multiples of them
    (one block of each on the simulator: a few hundred threads)."""
    rng = np.random.default_rng(11)
    for step, (kernel, block, tile) in M.LADDER.items():
        if step == "coalesced":
            continue
        m, n, k = tile[0] - 3, tile[1] - 5, 13
        A, B = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
        assert np.allclose(M.matmul(A, B, step), A.astype(np.float64) @ B, atol=1e-4), step


def test_the_tracer_names_a_planted_race_with_both_threads_and_the_line():
    TPB = 8

    @cuda.jit
    def rotate_racy(a, out):
        t = cuda.threadIdx.x
        buf = cuda.shared.array(TPB, float32)
        buf[t] = a[cuda.grid(1)]
        out[cuda.grid(1)] = buf[(t + 1) % TPB]          # no barrier: slot t + 1 may not be written yet

    a = np.arange(16, dtype=np.float32)
    t = trace(rotate_racy, 2, TPB, a=a, out=np.zeros_like(a))
    races = t.races()
    assert len(races) == 16                            # every slot of both blocks
    text = t.describe_race(races[0])
    assert "buf (shared, block 0)[0]" in text and "thread 0 writes it" in text and "thread 7 reads it" in text
    assert "`buf[t] = a[cuda.grid(1)]`" in text and "`out[cuda.grid(1)] = buf[(t + 1) % TPB]`" in text
    assert "races: 16, first: buf" in str(t.profile())
    assert trace(P.k_pool3, 2, P.TPB, a=np.ones(40), out=np.zeros(40)).races() == []


def test_the_tracer_reports_a_global_race_and_out_of_bounds_without_stopping():
    @cuda.jit
    def last_writer_wins(a, out):
        out[0] = a[cuda.grid(1)]                        # every thread of the block writes out[0]

    t = sanitize(last_writer_wins, 1, 8, a=np.arange(6.0), out=np.zeros(1))
    p = t.profile()
    assert len(p.out_of_bounds) == 2 and "a[6] by thread (6,)" in p.out_of_bounds[0]
    assert len(p.races) == 1 and "out[0]" in p.races[0] and "writes it" in p.races[0]


def test_profile_counts_the_ladder_properties():
    rng = np.random.default_rng(2)
    A, B = rng.standard_normal((32, 16)).astype(np.float32), rng.standard_normal((16, 32)).astype(np.float32)
    counts = {}
    for step, (kernel, block, tile) in M.small_ladder().items():
        t = trace(kernel, M.grid_for((32, 32), tile), block, A=A, B=B, C=np.zeros((32, 32), np.float32))
        counts[step] = t.profile(multiply_adds=32 * 32 * 16)
    assert counts["coalesced"].per_multiply_add(counts["coalesced"].global_loads) == 2
    assert counts["tiled"].per_multiply_add(counts["tiled"].global_loads) == 2 / 8
    assert counts["tiled"].per_multiply_add(counts["tiled"].shared_loads) == 2
    assert counts["1D blocking"].per_multiply_add(counts["1D blocking"].shared_loads) == 1 + 1 / 4
    assert counts["2D blocking"].per_multiply_add(counts["2D blocking"].shared_loads) == 1 / 4 + 1 / 4
    assert all(p.bank_conflicts == 0 and not p.races for p in counts.values())
    assert counts["2D blocking"].transactions_per_flop() < counts["tiled"].transactions_per_flop()


def test_selective_scan_matches_sequential_reference(rng):
    batch, L, d, N = 2, 6, 3, 5
    x = rng.standard_normal((batch, L, d))
    dt = rng.uniform(0.05, 0.5, (batch, L, d))
    A = -rng.uniform(0.5, 2, (d, N))
    B, C = rng.standard_normal((batch, L, N)), rng.standard_normal((batch, L, N))
    D = rng.standard_normal(d)
    y = S.selective_scan(x, dt, A, B, C, D)
    assert np.allclose(y, S.selective_scan_reference(x, dt, A, B, C, D), rtol=1e-10, atol=1e-12)


def test_scan_reference_is_the_recurrence(rng):
    """The numpy reference, unrolled by hand for one channel and two steps."""
    x, dt = rng.standard_normal((1, 2, 1)), rng.uniform(0.1, 0.5, (1, 2, 1))
    A, B, C, D = -rng.uniform(0.5, 2, (1, 3)), rng.standard_normal((1, 2, 3)), rng.standard_normal((1, 2, 3)), \
        rng.standard_normal(1)
    h1 = dt[0, 0, 0] * B[0, 0] * x[0, 0, 0]
    h2 = np.exp(dt[0, 1, 0] * A[0]) * h1 + dt[0, 1, 0] * B[0, 1] * x[0, 1, 0]
    y = S.selective_scan_reference(x, dt, A, B, C, D)
    assert np.allclose(y[0, :, 0], [C[0, 0] @ h1 + D[0] * x[0, 0, 0], C[0, 1] @ h2 + D[0] * x[0, 1, 0]])


# ---- the launcher -----------------------------------------------------------------------------

@cuda.jit
def _big_shared(a):
    buf = cuda.shared.array(13000, float32)          # 52,000 bytes: more than a block gets
    buf[0] = 1.0
    a[0] = buf[0]


def test_launcher_refuses_what_a_gpu_refuses():
    a, out = np.arange(5.0), np.zeros(5)
    with pytest.raises(LaunchError, match="at most 1024"):
        launch(P.k_guard_add10, 1, 2048, a, out)
    with pytest.raises(LaunchError, match="axis z"):
        launch(P.k_guard_add10, 1, (1, 1, 65), a, out)
    with pytest.raises(LaunchError, match="shared memory"):
        launch(_big_shared, 1, 1, a)
    with pytest.raises(LaunchError, match="simulator"):
        launch(P.k_guard_add10, 100, 1024, a, out)
    with pytest.raises(LaunchError, match="sizes an array with an expression"):
        launch(_sized_by_expression, 1, 1, a)          # the simulator runs it; a GPU's compiler refuses it


@cuda.jit
def _sized_by_expression(a):
    buf = cuda.shared.array(P.TPB + 2, float32)
    buf[0] = 1.0
    a[0] = buf[0]


def test_launcher_copies_and_reports():
    a, out = np.arange(5.0), np.zeros(5)
    run = launch(P.k_guard_add10, 1, 8, a, out)
    assert np.array_equal(out, a + 10)
    assert run.device == "simulator" and run.threads == 8 and run.block == (8,)


def test_simulator_catches_out_of_bounds_but_wraps_negative_indices():
    @cuda.jit
    def shift_left(a, out):                       # reads a[i - 1]: a[-1] for thread 0
        i = cuda.grid(1)
        if i < a.size:
            out[i] = a[i - 1]

    a, out = np.arange(1.0, 6.0), np.zeros(5)
    launch(shift_left, 1, 5, a, out)
    assert out[0] == a[-1]                        # wrapped silently
    with pytest.raises(IndexError):
        launch(P.k_map_add10, 1, 6, a, out)      # thread 5 reads a[5]


# ---- the tracer ---------------------------------------------------------------------------------

def test_trace_runs_the_kernel_and_logs_every_access(rng):
    a = rng.standard_normal(20)
    t = trace(P.k_pool3, 1, 32, a=a, out=np.zeros(20))
    assert np.allclose(t.arrays["out"], P.pool3(a))
    writes = t.accesses("out", "write")
    assert sorted(e.index[0] for e in writes) == list(range(20))
    assert all(e.thread == e.index[0] for e in writes)
    shared = [n for n in t.arrays if "shared" in n]
    assert shared == ["buf (shared, block 0)"]
    assert {e.phase for e in t.accesses(shared[0], "read")} == {1}      # after the barrier


def test_trace_flags_what_the_simulator_misses(rng):
    @cuda.jit
    def shift_left(a, out):
        i = cuda.grid(1)
        if i < a.size:
            out[i] = a[i - 1]

    with pytest.raises(KernelTraceError, match="negative index"):
        trace(shift_left, 1, 8, a=rng.standard_normal(8), out=np.zeros(8))
    with pytest.raises(KernelTraceError, match="out of bounds"):
        trace(P.k_map_add10, 1, 9, a=rng.standard_normal(8), out=np.zeros(8))


def test_warp_report_sees_coalescing_and_bank_conflicts(rng):
    @cuda.jit
    def copy_rows(a, out):
        col, row = cuda.grid(2)
        out[row, col] = a[row, col]

    @cuda.jit
    def copy_cols(a, out):
        row, col = cuda.grid(2)
        out[row, col] = a[row, col]

    @cuda.jit
    def tile_column(a, out):
        t = cuda.threadIdx.x
        tile = cuda.shared.array((32, 32), float32)
        for r in range(32):
            tile[r, t] = a[r, t]
        cuda.syncthreads()
        out[t] = tile[t, 0]

    m = rng.standard_normal((32, 32)).astype(np.float32)
    rows = trace(copy_rows, (1, 32), (32, 1), a=m, out=np.zeros_like(m)).warp_report()
    cols = trace(copy_cols, (1, 32), (32, 1), a=m, out=np.zeros_like(m)).warp_report()
    assert rows["a"]["segments per access"] == 1.0          # 32 floats in a row: one 128-byte segment
    assert cols["a"]["segments per access"] == 32.0         # a column: 32 rows, 32 segments
    bank = trace(tile_column, 1, 32, a=m, out=np.zeros(32, np.float32)).warp_report()
    assert bank["tile (shared, block 0)"]["worst bank conflict"] == 32


def test_trace_draws():
    import matplotlib
    matplotlib.use("Agg")
    t = trace(P.k_blocks2d_add10, (2, 2), (4, 4), a=np.arange(35.0).reshape(5, 7), out=np.zeros((5, 7)))
    fig = t.draw(highlight=(0, 5))
    assert len(fig.axes) == 2


def test_selective_scan_matches_chapter_05(rng):
    """The kernel against chapter 05's sequential reference (PyTorch, float64), same shapes."""
    torch = pytest.importorskip("torch")
    mamba_scan = pytest.importorskip("course_lib.mamba.scan")
    batch, L, d, N = 1, 5, 2, 7
    x, dt = rng.standard_normal((batch, L, d)), rng.uniform(0.05, 0.5, (batch, L, d))
    A = -rng.uniform(0.5, 2, (d, N))
    B, C, D = rng.standard_normal((batch, L, N)), rng.standard_normal((batch, L, N)), rng.standard_normal(d)
    ref = mamba_scan.selective_scan_sequential(*(torch.tensor(v) for v in (x, dt, A, B, C, D)))
    assert np.allclose(S.selective_scan(x, dt, A, B, C, D), ref.numpy(), rtol=1e-10, atol=1e-12)


def test_shared_arrays_stay_shared_when_threads_switch_often():
    """The simulator runs a block's threads as Python threads; each must get the same shared array
    even when the interpreter switches threads inside the allocation (a wrong sum otherwise)."""
    import sys

    from course_lib.cuda import puzzles

    rng = np.random.default_rng(5)
    x, y = rng.uniform(-1, 1, 75), rng.uniform(-1, 1, 75)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        results = [puzzles.dot(x, y) for _ in range(4)]
    finally:
        sys.setswitchinterval(old)
    np.testing.assert_allclose(results, [x @ y] * 4, rtol=1e-12)
