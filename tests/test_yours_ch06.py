"""Chapter 06 carried forward: the learner's Numba kernels as the "yours-numba" tensor backend.

With the reference solutions saved as the learner's, the backend runs the learner's kernels (each call on the
fastest one that serves it, down to the general strided ones), equals the numpy backend on random strided
views, and the payoff trains the digits MLP to the same losses; a wrong kernel saved stops the payoff at
once, named; `yours.use("06", False)` runs the course's.
"""

import carried
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.checks import CheckFailed
from course_lib.tensor.backend import MAP_OPS, ZIP_OPS, get_backend
from course_lib.tensor.numpy_backend import backend as numpy_backend
from course_lib.tensor.tensor_data import TensorData, slice_view
from course_lib.yours import numba_backend

SOME_MAP_OPS, SOME_ZIP_OPS = ("id", "neg", "exp"), ("add", "sub", "mul", "div")   # a GPT's commonest


saved, learner = carried.fixtures("06")   # solutions/06 (minus the payoff) ran as the learner's: every kernel saved
payoff = carried.payoff_fixture("06")      # the payoff run once on it: (namespace, printed text)


def test_payoff_trains_on_your_kernels_to_the_numpy_losses(payoff):
    namespace, text = payoff
    assert ("your strided_copy runs copy of strided views; your flat_map runs map, contiguous; your strided_map "
            "runs map, strided; your flat_zip runs zip, contiguous; your strided_zip runs zip, strided; your "
            "sum_columns runs sum, down contiguous columns; your sum_dim runs sum, other; your blas_matmul runs "
            "matmul; the course's kernels run reduce max, where") in text
    assert "the largest difference from the numpy backend's losses is below 1e-4: True" in text
    runs = namespace["runs"]
    assert runs["yours-numba"]["accuracy"] == runs["numba"]["accuracy"] == runs["numpy"]["accuracy"] > 0.9
    backend = namespace["backend"]
    assert get_backend("yours-numba") is backend
    # the MLP's calls: products, contiguous elementwise ops, bias gradients (column sums), copies, row sums
    assert {"blas_matmul", "flat_map", "flat_zip", "sum_columns", "strided_copy", "sum_dim"} <= set(backend.calls)
    assert all(k.__module__ == "course_yours_ch06" for k in backend.kernels.values())


def _view(rng, shape, dtype):
    """A random view of `shape`: contiguous, permuted, sliced (offset and step) or expanded (stride 0)."""
    kind = rng.integers(4) if shape else 0
    if kind == 1:
        order = rng.permutation(len(shape))
        parent = TensorData.from_numpy(rng.uniform(0.5, 2, tuple(shape[i] for i in np.argsort(order))), dtype)
        return parent.permute(*order)
    if kind == 2:
        parent = TensorData.from_numpy(rng.uniform(0.5, 2, tuple(2 * n + 1 for n in shape)), dtype)
        return slice_view(parent, tuple(slice(1, 2 * n + 1, 2) for n in shape))
    if kind == 3:
        small = tuple(1 if rng.random() < 0.5 else n for n in shape)
        return TensorData.from_numpy(rng.uniform(0.5, 2, small), dtype).expand(shape)
    return TensorData.from_numpy(rng.uniform(0.5, 2, shape), dtype)


def _same(yours_td, numpy_td):
    assert yours_td.shape == numpy_td.shape and yours_td.dtype == numpy_td.dtype
    tol = 1e-5 if yours_td.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(yours_td.to_numpy(), numpy_td.to_numpy(), rtol=tol, atol=tol)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_backend_equals_numpy_on_random_views(payoff, seed):
    backend = payoff[0]["backend"]
    rng = np.random.default_rng(seed)
    dtype = (np.float32, np.float64)[seed % 2]
    shape = tuple(int(n) for n in rng.integers(1, 6, size=rng.integers(0, 4)))
    a, b = _view(rng, shape, dtype), _view(rng, shape[int(rng.integers(0, len(shape) + 1)):], dtype)
    before = dict(backend.calls)
    for op in SOME_MAP_OPS:                          # every op, special values included: the test below
        _same(backend.map(op, a), numpy_backend.map(op, a))
    for op in SOME_ZIP_OPS:                          # b has lower rank: broadcast, aligned on the right
        _same(backend.zip(op, a, b), numpy_backend.zip(op, a, b))
        _same(backend.zip(op, b, a), numpy_backend.zip(op, b, a))
    for dim in range(len(shape)):
        _same(backend.reduce("sum", a, dim), numpy_backend.reduce("sum", a, dim))
    target = TensorData.zeros(shape + (2,), dtype)   # into strided outs: every other element of a bigger one
    backend.map("neg", b, slice_view(target, (Ellipsis, 0)))
    backend.map("id", b, slice_view(target, (Ellipsis, 1)))            # a copy: your strided_copy
    np.testing.assert_array_equal(target.to_numpy()[..., 0], -np.broadcast_to(b.to_numpy(), shape))
    np.testing.assert_array_equal(target.to_numpy()[..., 1], np.broadcast_to(b.to_numpy(), shape))
    n, k, m = (int(v) for v in rng.integers(1, 7, size=3))
    x = _view(rng, (int(rng.integers(1, 3)), n, k), dtype)
    w = TensorData.from_numpy(rng.uniform(-1, 1, (m, k)), dtype).permute(1, 0)   # a transposed (k, m)
    _same(backend.matmul(x, w), numpy_backend.matmul(x, w))
    used = {name for name, count in backend.calls.items() if count > before.get(name, 0)}
    assert "blas_matmul" in used and ("strided_copy" in used or np.prod(shape) == 1)   # one element is contiguous


@pytest.mark.parametrize("missing", ["flat_zip", "row_layout", "strided_copy", "sum_columns", "blas_matmul"])
def test_each_call_falls_back_to_the_next_kernel_of_yours(payoff, missing):
    """Without one fast path, its calls go to your general kernel (or to your i-k-j matmul), same results."""
    kernels = {k: v for k, v in payoff[0]["backend"].kernels.items() if k != missing}
    backend = numba_backend.YoursNumbaBackend(kernels, get_backend("numba"))
    rng = np.random.default_rng(7)
    a = TensorData.from_numpy(rng.uniform(-1, 1, (5, 7)), np.float64)
    row = TensorData.from_numpy(rng.uniform(-1, 1, 7), np.float64)
    _same(backend.zip("mul", a, row), numpy_backend.zip("mul", a, row))
    _same(backend.map("id", a.permute(1, 0)), numpy_backend.map("id", a.permute(1, 0)))
    _same(backend.reduce("sum", a, 0), numpy_backend.reduce("sum", a, 0))
    _same(backend.matmul(a, a.permute(1, 0)), numpy_backend.matmul(a, a.permute(1, 0)))
    assert missing not in backend.calls
    fallback = {"flat_zip": "strided_zip", "row_layout": "strided_zip", "strided_copy": "strided_map",
                "sum_columns": "sum_dim", "blas_matmul": "matmul"}[missing]
    assert backend.calls[fallback] > 0


def test_special_values_as_the_numpy_backend(payoff):
    """Each op arrives in your kernels as the course's scalar function: inf, nan and 0 as numpy has them.
    Every op in float64 (your flat kernels compile once per op and dtype), a few in float32."""
    backend = payoff[0]["backend"]
    values = [0.0, -0.0, -1.5, 2.0, np.inf, -np.inf, np.nan, 1e30, 800.0]
    for dtype, map_ops, zip_ops in ((np.float64, MAP_OPS, ZIP_OPS), (np.float32, SOME_MAP_OPS, SOME_ZIP_OPS)):
        x = TensorData.from_numpy(values, dtype)
        rows, cols = x.view((len(values), 1)), x.view((1, len(values)))     # every pair, by broadcasting
        with np.errstate(all="ignore"):
            for op in map_ops:
                np.testing.assert_allclose(backend.map(op, x).to_numpy(), numpy_backend.map(op, x).to_numpy(),
                                           rtol=1e-6, err_msg=op)
            for op in zip_ops:
                np.testing.assert_allclose(backend.zip(op, rows, cols).to_numpy(),
                                           numpy_backend.zip(op, rows, cols).to_numpy(), rtol=1e-6, err_msg=op)


def test_a_wrong_kernel_stops_the_payoff_named(learner):
    carried.break_piece("06", "flat_kernels", "fn(x[j if a_spread else 0], y[j if b_spread else 0])",
                        "fn(y[j if b_spread else 0], x[j if a_spread else 0])")     # a and b swapped
    namespace = {}
    with pytest.raises(CheckFailed, match="your saved `flat_kernels` .flat_map, flat_zip."):
        carried.run_payoff("06", namespace)
    assert "runs" not in namespace                       # stopped in the first cell, before any training


def test_switched_off_the_course_kernels_run(saved, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_WORKSPACE", str(saved))
    with carried.switched_off("06"):
        backend = numba_backend.build()
    assert "none of your kernels" in capsys.readouterr().out
    assert not backend.kernels
    a = TensorData.from_numpy(np.arange(6.0).reshape(2, 3), np.float64)
    _same(backend.zip("mul", a, a), numpy_backend.zip("mul", a, a))
    _same(backend.reduce("sum", a, 1), numpy_backend.reduce("sum", a, 1))
    _same(backend.matmul(a, a.permute(1, 0)), numpy_backend.matmul(a, a.permute(1, 0)))
    assert not backend.calls
