"""The Numba backend agrees with the numpy backend and with PyTorch on strided views."""

import numpy as np
import pytest
import torch

from course_lib.fast.backend import backend as nb
from course_lib.tensor.backend import MAP_OPS, REDUCE_OPS, ZIP_OPS, get_backend
from course_lib.tensor.numpy_backend import backend as npb
from course_lib.tensor.tensor_data import TensorData, slice_view

RNG = np.random.default_rng(6)


def views(dtype=np.float64):
    """A contiguous, a permuted, a sliced (offset, step) and an expanded view, all of shape (3, 5, 7)."""
    base = TensorData.from_numpy(RNG.uniform(-2, 2, (3, 5, 7)), dtype)
    permuted = TensorData.from_numpy(RNG.uniform(-2, 2, (7, 3, 5)), dtype).permute(1, 2, 0)
    sliced = slice_view(TensorData.from_numpy(RNG.uniform(-2, 2, (4, 11, 8)), dtype), (slice(1, 4), slice(0, 10, 2), slice(1, 8)))
    expanded = TensorData.from_numpy(RNG.uniform(-2, 2, (5, 1)), dtype).expand((3, 5, 7))
    return {"contiguous": base, "permuted": permuted, "sliced": sliced, "expanded": expanded}


def close(x, y, dtype=np.float64):
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(x.to_numpy(), y.to_numpy(), rtol=tol, atol=tol, equal_nan=True)
    assert x.shape == y.shape and x.dtype == y.dtype


def test_registry_finds_the_backend():
    assert get_backend("numba") is nb


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_map_every_op_every_layout(dtype):
    for name, view in views(dtype).items():
        for op in MAP_OPS:
            close(nb.map(op, view), npb.map(op, view), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sigmoid_over_the_whole_range(dtype):
    """sigmoid runs as numpy's exp(-|x|) and one compiled pass: equal to torch's from -800 to 800, at
    +-inf and nan, with no overflow warning (exp only ever sees numbers <= 0)."""
    x = np.concatenate([np.random.default_rng(5).uniform(-800, 800, 997), [-np.inf, np.inf, np.nan, 0.0, -0.0]])
    x = x.astype(dtype)
    with np.errstate(over="raise"):
        ours = nb.map("sigmoid", TensorData.from_numpy(x, dtype)).to_numpy()
    theirs = torch.sigmoid(torch.tensor(x)).numpy()
    tiny = np.finfo(dtype).tiny
    np.testing.assert_allclose(ours, theirs, rtol=4 * np.finfo(dtype).eps, atol=tiny, equal_nan=True)


def test_map_into_a_strided_out_and_scalars():
    big = TensorData.zeros((6, 9), np.float64)
    out = slice_view(big, (slice(1, 6, 2), slice(0, 9, 3)))  # (3, 3) view, offset 9
    src = TensorData.from_numpy(RNG.uniform(-1, 1, (3,)), np.float64)
    nb.map("id", src, out)
    expected = np.zeros((6, 9))
    expected[1:6:2, 0:9:3] = src.to_numpy()
    np.testing.assert_array_equal(big.to_numpy(), expected)
    scalar = TensorData.from_numpy([1.5], np.float64).view(())
    assert nb.map("exp", scalar).shape == () and np.isclose(nb.map("exp", scalar).to_numpy(), np.exp(1.5))
    empty = TensorData.zeros((0, 4))
    assert nb.map("neg", empty).shape == (0, 4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_zip_every_op_with_broadcasting(dtype):
    v = views(dtype)
    row = TensorData.from_numpy(RNG.uniform(0.5, 2, (7,)), dtype)
    col = TensorData.from_numpy(RNG.uniform(0.5, 2, (5, 1)), dtype)
    for op in ZIP_OPS:
        for a, b in [(v["permuted"], v["sliced"]), (v["expanded"], row), (col, v["permuted"]), (col, row)]:
            if op == "pow":
                a = nb.map("exp", a)  # a positive base
            close(nb.zip(op, a, b), npb.zip(op, a, b), dtype)


def test_zip_mixed_dtypes_and_special_values():
    a = TensorData.from_numpy([1.0, -1.0, 0.0, np.nan, 2.0], np.float32)
    b = TensorData.from_numpy([0.0, 0.0, 0.0, 1.0, np.nan], np.float64)
    for op in ZIP_OPS:
        close(nb.zip(op, a, b), npb.zip(op, a, b))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reduce_every_dim(dtype):
    for name, view in views(dtype).items():
        for op in REDUCE_OPS:
            for dim in range(3):
                close(nb.reduce(op, view, dim), npb.reduce(op, view, dim), dtype)


def test_where_keeps_inf_out_of_the_branch_not_taken():
    cond = TensorData.from_numpy([[1.0], [0.0]], np.float64)
    a = TensorData.from_numpy([np.inf, 1.0, 2.0], np.float64)
    b = TensorData.from_numpy([3.0, 4.0, 5.0], np.float64)
    close(nb.where(cond, a, b), npb.where(cond, a, b))


def operands(rows, cols, dtype):
    """A full (rows, cols) operand, and the others flat.py reads by kind: row, column, one number."""
    def td(shape):
        return TensorData.from_numpy(RNG.uniform(0.5, 2, shape), dtype)
    return td((rows, cols)), [td((rows, cols)), td((cols,)), td((1, cols)), td((rows, 1)), td(()), td((1, 1))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_flat_kernels_every_kind(dtype):
    """Every zip op on two kinds of second operand (full, row, column, 1-row, one number, 1x1), on both
    sides, the kinds turning with the op so that all six meet ops: each (op, kind) compiles a kernel of
    its own, and all of them (every op on every kind) would take a minute to compile."""
    full, others = operands(9, 37, dtype)
    for i, op in enumerate(ZIP_OPS):
        for other in (others[i % len(others)], others[(i + 3) % len(others)]):
            close(nb.zip(op, full, other), npb.zip(op, full, other), dtype)
            close(nb.zip(op, other, full), npb.zip(op, other, full), dtype)
    close(nb.zip("sub", others[3], others[1]), npb.zip("sub", others[3], others[1]), dtype)  # column - row
    batch = TensorData.from_numpy(RNG.uniform(-2, 2, (2, 1, 9, 37)), dtype).expand((2, 3, 9, 37))
    stacked = nb.map("id", batch)  # contiguous (2, 3, 9, 37): full reads it as a row of 9 x 37
    close(nb.zip("add", stacked, full), npb.zip("add", stacked, full), dtype)
    cond = TensorData.from_numpy(RNG.uniform(-1, 1, (9, 37)) > 0, dtype)
    for a, b in [(full, others[4]), (others[1], full), (others[3], others[2]), (stacked, others[5])]:
        close(nb.where(cond, a, b), npb.where(cond, a, b), dtype)
    for op in REDUCE_OPS:
        close(nb.reduce(op, full, 1), npb.reduce(op, full, 1), dtype)


def test_flat_kernels_on_every_thread():
    """Above PARALLEL_MIN elements map, zip and reduce run the parallel flavour of flat.py's kernels."""
    from course_lib.fast.pool import PARALLEL_MIN
    full, others = operands(PARALLEL_MIN // 301 + 3, 301, np.float32)
    for other in (others[0], others[1], others[3], others[4]):
        close(nb.zip("div", full, other), npb.zip("div", full, other), np.float32)
    close(nb.map("exp", full), npb.map("exp", full), np.float32)
    for op in REDUCE_OPS:
        close(nb.reduce(op, full, 1), npb.reduce(op, full, 1), np.float32)
    cond = TensorData.from_numpy(RNG.uniform(-1, 1, (1, 301)) > 0, np.float32)
    close(nb.where(cond, full, others[4]), npb.where(cond, full, others[4]), np.float32)


@pytest.mark.parametrize("shape_a, shape_b", [((37, 70), (70, 19)), ((3, 5, 6), (6, 4)), ((2, 1, 5, 3), (4, 3, 2)),
                                              ((1, 9), (9, 1)), ((0, 3), (3, 2))])
def test_matmul_matches_torch(shape_a, shape_b):
    a = RNG.uniform(-1, 1, shape_a)
    b = RNG.uniform(-1, 1, shape_b)
    yours = nb.matmul(TensorData.from_numpy(a, np.float64), TensorData.from_numpy(b, np.float64))
    expected = (torch.tensor(a) @ torch.tensor(b)).numpy()
    assert yours.shape == expected.shape
    np.testing.assert_allclose(yours.to_numpy(), expected, rtol=1e-12, atol=1e-12)


def test_matmul_on_transposed_views():
    a = TensorData.from_numpy(RNG.uniform(-1, 1, (65, 130)), np.float32).permute(1, 0)
    b = TensorData.from_numpy(RNG.uniform(-1, 1, (33, 65)), np.float32).permute(1, 0)
    yours = nb.matmul(a, b)
    expected = torch.tensor(a.to_numpy(), dtype=torch.float64) @ torch.tensor(b.to_numpy(), dtype=torch.float64)
    assert yours.dtype == np.float32
    np.testing.assert_allclose(yours.to_numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("a_t, b_t", [(False, True), (True, False), (True, True)])
def test_batched_matmul_on_transposes_and_copies(a_t, b_t):
    """gemm reads a transposed operand in place; a sliced one is copied; batch dims broadcast."""
    a = RNG.uniform(-1, 1, (2, 1, 6, 5) if a_t else (2, 1, 5, 6))
    b = RNG.uniform(-1, 1, (3, 7, 6) if b_t else (3, 6, 7))
    ta, tb = TensorData.from_numpy(a, np.float64), TensorData.from_numpy(b, np.float64)
    ta = ta.permute(0, 1, 3, 2) if a_t else ta
    tb = tb.permute(0, 2, 1) if b_t else tb
    expected = (torch.tensor(ta.to_numpy()) @ torch.tensor(tb.to_numpy())).numpy()
    np.testing.assert_allclose(nb.matmul(ta, tb).to_numpy(), expected, rtol=1e-12, atol=1e-12)
    sliced = slice_view(TensorData.from_numpy(RNG.uniform(-1, 1, (7, 9)), np.float32), (slice(0, 7), slice(1, 9, 2)))
    expected = torch.tensor(sliced.to_numpy(), dtype=torch.float64) @ torch.tensor(tb.to_numpy()[0, :4])
    np.testing.assert_allclose(nb.matmul(sliced, TensorData.from_numpy(tb.to_numpy()[0, :4], np.float64)).to_numpy(),
                               expected.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(70, 45), (3, 33, 65), (1, 1), (2, 4, 1, 97)])
def test_pack_transposed_matches_numpy(shape):
    from course_lib.fast.matmul import pack_transposed
    b = RNG.uniform(-1, 1, shape)
    k, m = shape[-2:]
    for view in (b, b[..., ::2, :][..., :k, :], np.broadcast_to(b[..., :1], shape)):   # contiguous, strided, stride 0
        got = pack_transposed(view, np.float32)
        assert got.dtype == np.float32 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, np.swapaxes(view, -1, -2).astype(np.float32).reshape(-1, *got.shape[1:]))
    t = np.ascontiguousarray(np.swapaxes(b, -1, -2))      # b given as a transpose: packing is a free view
    assert np.shares_memory(pack_transposed(np.swapaxes(t, -1, -2), np.float64), t)


def test_row_block_keeps_every_thread_busy():
    from course_lib.fast.matmul import row_block
    assert row_block(1024, 1, 2) == 128            # big: fewer passes over B
    assert row_block(64, 1, 2) == 16               # small: 4 tasks for 2 threads
    assert row_block(200, 1, 4) == 16 and row_block(200, 8, 4) == 128
    for n, nb_, th in [(1000, 1, 2), (300, 2, 8), (17, 1, 2)]:
        ti = row_block(n, nb_, th)
        assert 16 <= ti <= 128 and (ti == 16 or nb_ * -(-n // ti) >= 2 * th)


@pytest.mark.parametrize("n, k, m", [(257, 131, 301), (1, 300, 5), (130, 1, 129)])
def test_matmul_big_blocks_and_ragged_edges(n, k, m):
    a, b = RNG.uniform(-1, 1, (n, k)), RNG.uniform(-1, 1, (k, m))
    yours = nb.matmul(TensorData.from_numpy(a, np.float64), TensorData.from_numpy(b, np.float64))
    np.testing.assert_allclose(yours.to_numpy(), (torch.tensor(a) @ torch.tensor(b)).numpy(), rtol=1e-12, atol=1e-12)


def close_reduction(ours, x, op, dim):
    """ours against numpy's reduction of x in float64. max is exact; a float32 sum of n numbers may differ
    from the exact one by about n * eps * max|x| (the order of the additions differs from numpy's)."""
    exact = getattr(np, op)(x.to_numpy().astype(np.float64), axis=dim, keepdims=True)
    eps = np.finfo(x.dtype).eps
    bound = 0.0 if op == "max" else 2 * x.shape[dim] * eps * np.abs(x.to_numpy()).max()
    np.testing.assert_allclose(ours.to_numpy(), exact, rtol=0, atol=bound + 1e-300,
                               err_msg=f"reduce {op} over dim {dim} of {x.shape} {x.dtype}")
    assert ours.shape == exact.shape and ours.dtype == x.dtype


@pytest.mark.parametrize("shape", [(1, 37), (9, 37), (6, 5, 43), (3, 7, 2, 9), (4, 1, 10)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_flat_reductions_over_every_dim(shape, dtype):
    """Contiguous inputs reduce with flat.py's kernels: the last dim in four lanes (rows whose length is
    not a multiple of 4 included), any other dim in rows (an inner block of 8 or more) or strided."""
    x = TensorData.from_numpy(np.random.default_rng(len(shape)).uniform(-3, 3, shape), dtype)
    for op in REDUCE_OPS:
        for dim in range(len(shape)):
            close_reduction(nb.reduce(op, x, dim), x, op, dim)


def test_flat_reductions_on_every_thread():
    from course_lib.fast.pool import PARALLEL_MIN
    x = TensorData.from_numpy(np.random.default_rng(1).uniform(-3, 3, (PARALLEL_MIN // 250 + 5, 5, 50)), np.float32)
    for op in REDUCE_OPS:
        for dim in range(3):
            close_reduction(nb.reduce(op, x, dim), x, op, dim)


@pytest.mark.parametrize("name", ["adam", "adam+wd", "adamw", "adamw groups"])
@pytest.mark.parametrize("dtype, size", [(np.float64, 97), (np.float32, 97), (np.float32, 300_001)])
def test_fused_adam_matches_torch(name, dtype, size, monkeypatch):
    """On the Numba backend, optim.Adam's update is one kernel (fast/adam.py); it equals torch's, on
    both flavours (the parallel one above PARALLEL_MIN parameters)."""
    from course_lib import tensor as ct
    from course_lib.fast import backend as fast
    from course_lib.tensor import nn, optim

    calls, fused = [], fast.NumbaBackend.adam
    monkeypatch.setattr(fast.NumbaBackend, "adam", lambda self, *a: calls.append(1) or fused(self, *a))
    rng = np.random.default_rng(4)
    w0, b0 = rng.standard_normal(size), rng.standard_normal(7)
    ours = [nn.Parameter(w0.astype(dtype), dtype=dtype), nn.Parameter(b0.astype(dtype), dtype=dtype)]
    theirs = [torch.tensor(v.astype(dtype), requires_grad=True) for v in (w0, b0)]

    def make(lib, params):
        adam, adamw = (optim.Adam, optim.AdamW) if lib is optim else (torch.optim.Adam, torch.optim.AdamW)
        return {"adam": lambda: adam(params, lr=0.01, betas=(0.8, 0.95)),
                "adam+wd": lambda: adam(params, lr=0.01, weight_decay=0.1),
                "adamw": lambda: adamw(params, lr=0.01, weight_decay=0.1),
                "adamw groups": lambda: adamw([{"params": params[:1], "weight_decay": 0.2},
                                               {"params": params[1:], "weight_decay": 0.0}], lr=0.02)}[name]()

    with ct.use_backend("numba"):
        opt, ref = make(optim, ours), make(torch, theirs)
        for step in range(4):
            grads = [rng.standard_normal(p.shape) for p in ours]
            for p, t, g in zip(ours, theirs, grads):
                p.grad, t.grad = ct.Tensor(g.astype(dtype), dtype=dtype), torch.tensor(g.astype(dtype))
            opt.step()
            ref.step()
    assert len(calls) == 4
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.numpy(), t.detach().numpy(), rtol=tol, atol=tol)

