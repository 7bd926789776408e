"""The CUDA backend of the tensor engine against the numpy backend, on strided views.

The full op suite (tests/test_ch02_ops.py) also runs on this backend; these tests pin the
strided cases the backend itself must get right: permuted, expanded, offset and 0-d views,
an `out` that is a slice of a bigger array, empty tensors and batched, broadcast matmul.
"""

import numpy as np
import pytest

from course_lib.cuda.backend import backend as cu
from course_lib.tensor import MAP_OPS, ZIP_OPS, TensorData, get_backend

npb = get_backend("numpy")


def data(rng, shape, dtype=np.float64, low=-2.0, high=2.0):
    return TensorData.from_numpy(rng.uniform(low, high, shape), dtype=dtype)


def same(ours, ref, rtol=1e-12, atol=1e-12):
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    np.testing.assert_allclose(ours.to_numpy(), ref.to_numpy(), rtol=rtol, atol=atol, equal_nan=True)


@pytest.fixture
def rng():
    return np.random.default_rng(3)


def test_every_map_op_on_a_permuted_view(rng):
    a = data(rng, (3, 5)).permute(1, 0)
    for op in MAP_OPS:
        x = TensorData.from_numpy(np.abs(a.to_numpy()) + 0.1, np.float64) if op in ("log", "sqrt") else a
        same(cu.map(op, x), npb.map(op, x))


def test_every_zip_op_with_broadcasting(rng):
    a, b = data(rng, (2, 3, 5)), data(rng, (3, 1), low=0.5, high=2.0)
    for op in ZIP_OPS:
        x = TensorData.from_numpy(np.abs(a.to_numpy()), np.float64) if op == "pow" else a
        same(cu.zip(op, x, b), npb.zip(op, x, b))


def test_zip_keeps_the_wider_dtype_and_handles_0d(rng):
    a, s = data(rng, (4,), np.float32), TensorData.from_numpy(1.25, np.float64)
    same(cu.zip("mul", a, s), npb.zip("mul", a, s))
    same(cu.map("exp", s), npb.map("exp", s))


def test_map_into_a_strided_out_slice(rng):
    b = data(rng, (5,))
    big, ref = TensorData.zeros((4, 5), np.float64), TensorData.zeros((4, 5), np.float64)
    for store in (big, ref):
        rows = TensorData(store.storage, (2, 5), (10, 1), 5)          # rows 1 and 3
        (cu if store is big else npb).map("id", b, rows)
    same(big, ref)


def test_reduce_every_dim_of_an_offset_view(rng):
    base = data(rng, (5, 4, 6))
    view = TensorData(base.storage, (4, 3, 6), base.strides, base.offset + 24)   # rows 1.., columns ..3
    view = view.permute(2, 0, 1)
    for dim in range(3):
        for op in ("sum", "max"):
            same(cu.reduce(op, view, dim), npb.reduce(op, view, dim))


def test_inf_and_nan_like_numpy():
    x = TensorData.from_numpy([-1.0, 0.0, 800.0, -800.0], np.float64)
    for op in ("log", "sqrt", "inv", "exp", "sigmoid"):
        same(cu.map(op, x), npb.map(op, x))
    zero = TensorData.from_numpy([0.0, 0.0, -0.0], np.float64)
    same(cu.zip("div", TensorData.from_numpy([1.0, 0.0, 2.0], np.float64), zero),
         npb.zip("div", TensorData.from_numpy([1.0, 0.0, 2.0], np.float64), zero))


def test_empty_tensors(rng):
    e = TensorData.zeros((0, 3), np.float64)
    assert cu.map("exp", e).shape == (0, 3)
    assert cu.zip("add", e, data(rng, (3,))).shape == (0, 3)
    assert cu.matmul(data(rng, (2, 0)), data(rng, (0, 3))).to_numpy().tolist() == [[0.0] * 3] * 2


@pytest.mark.parametrize("sa, sb", [((2, 1, 7, 19), (3, 19, 5)), ((9, 4), (4, 11)), ((3, 17, 6), (6, 18))])
def test_batched_broadcast_matmul(rng, sa, sb):
    a, b = data(rng, sa), data(rng, sb)
    same(cu.matmul(a, b), npb.matmul(a, b), rtol=1e-10, atol=1e-10)


def test_matmul_of_transposed_float32(rng):
    a = data(rng, (9, 4), np.float32)
    same(cu.matmul(a.permute(1, 0), a), npb.matmul(a.permute(1, 0), a), rtol=1e-5, atol=1e-5)
