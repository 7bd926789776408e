"""Every op code, on every backend, computes the scalar function of tensor/scalar_ops.py, and numpy's op.

The compiled backends turn an op's name into its code (its position in scalar_ops' table) and
run the table's own function; the numpy backend runs a whole-array form of it. A reordered
table, a stale list of names or a typo in one backend's formula shows here as one op giving
another's answer. The inputs mix negatives, positives, large |x| (exp and pow overflow, sigmoid
saturates), zeros, infinities and nan; on them no two ops agree.
"""

import functools

import numpy as np
import pytest

from course_lib.tensor import scalar_ops
from course_lib.tensor.backend import MAP_OPS, REDUCE_OPS, ZIP_OPS, backend_status, get_backend
from course_lib.tensor.numpy_backend import MAP as NUMPY_MAP
from course_lib.tensor.numpy_backend import ZIP as NUMPY_ZIP
from course_lib.tensor.tensor_data import TensorData

BACKENDS = ["numpy", "numba", "cuda"]
DTYPES = [np.float64, np.float32]
# The CUDA simulator runs the scalar functions on numpy scalars, which warn on inf - inf and the like.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning", "ignore:overflow:RuntimeWarning")
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan]


def map_inputs():
    """24 values: small, large |x| of both signs, and the special values."""
    rng = np.random.default_rng(18)
    big = rng.uniform(20.0, 900.0, 5) * np.array([1, -1, 1, -1, -1])
    return np.concatenate([rng.uniform(-4.0, 4.0, 14), big, SPECIAL]).reshape(4, 6)


def zip_inputs():
    """24 pairs (x, y): random ones, ties (for eq, le, ge), y = 0 (div), overflowing and nan powers."""
    rng = np.random.default_rng(19)
    x, y = rng.uniform(-3.0, 3.0, 12), rng.uniform(-3.0, 3.0, 12)
    y[:3] = x[:3]                                             # ties
    special = [(1.5, 0.0), (-2.0, -0.0), (0.0, 0.0), (0.0, -3.0), (40.0, 300.0), (-40.0, 301.0),
               (1e-300, -2.0), (-8.0, 1.0 / 3.0), (np.inf, -2.0), (-np.inf, 3.0), (np.nan, 1.0), (2.0, np.nan)]
    sx, sy = zip(*special)
    return np.concatenate([x, sx]).reshape(4, 6), np.concatenate([y, sy]).reshape(4, 6)


def scalar(f, *arrays, dtype):
    """The table's function in plain Python, element by element, rounded to `dtype`."""
    values = [f(*(float(v) for v in args)) for args in zip(*(a.ravel() for a in arrays))]
    with np.errstate(over="ignore"):
        return np.array(values, dtype=dtype).reshape(arrays[0].shape)


def views(x, dtype):
    """The same values contiguous and as a permuted view (the Numba backend's two code paths)."""
    return [TensorData.from_numpy(x, dtype), TensorData.from_numpy(np.ascontiguousarray(x.T), dtype).permute(1, 0)]


def same(ours, expected, dtype, what):
    tol = 1e-12 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(ours, expected, rtol=tol, atol=tol, equal_nan=True, err_msg=what)


@pytest.fixture(params=BACKENDS)
def backend(request):
    ok, why = backend_status(request.param)
    if not ok:
        pytest.skip(f"backend {request.param!r} unavailable: {why}")
    return get_backend(request.param)


def test_one_table_names_every_op_and_gives_its_code():
    assert list(MAP_OPS) == list(scalar_ops.MAP) and list(ZIP_OPS) == list(scalar_ops.ZIP)
    assert list(REDUCE_OPS) == list(scalar_ops.REDUCE)
    for table, codes in [(scalar_ops.MAP, scalar_ops.MAP_CODE), (scalar_ops.ZIP, scalar_ops.ZIP_CODE),
                         (scalar_ops.REDUCE, scalar_ops.REDUCE_CODE)]:
        assert [list(table)[code] for code in codes.values()] == list(codes)
    assert NUMPY_MAP.keys() == scalar_ops.MAP.keys() and NUMPY_ZIP.keys() == scalar_ops.ZIP.keys()
    for zip_op, _ in scalar_ops.REDUCE.values():
        assert zip_op in scalar_ops.ZIP


@pytest.mark.parametrize("kind", ["map", "zip"])
def test_the_inputs_give_every_op_a_different_answer(kind):
    table = scalar_ops.MAP if kind == "map" else scalar_ops.ZIP
    inputs = [map_inputs()] if kind == "map" else list(zip_inputs())
    results = {name: scalar(f, *inputs, dtype=np.float64) for name, f in table.items()}
    names = list(table)
    for i, p in enumerate(names):
        for q in names[i + 1:]:
            assert not np.array_equal(results[p], results[q], equal_nan=True), f"{p} and {q} agree on these inputs"


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_code_against_the_scalar_table_and_numpy(backend, dtype):
    npb = get_backend("numpy")
    with np.errstate(all="ignore"):
        x = map_inputs()
        for name, f in scalar_ops.MAP.items():
            expected, numpy_says = scalar(f, x, dtype=dtype), npb.map(name, views(x, dtype)[0]).to_numpy()
            same(numpy_says, expected, dtype, f"the numpy backend's {name!r} against scalar_ops.{f.__name__}")
            for view in views(x, dtype):
                same(backend.map(name, view).to_numpy(), expected, dtype, f"{backend.name} map {name!r}")
        a, b = zip_inputs()
        for name, f in scalar_ops.ZIP.items():
            expected = scalar(f, a, b, dtype=dtype)
            numpy_says = npb.zip(name, views(a, dtype)[0], views(b, dtype)[0]).to_numpy()
            same(numpy_says, expected, dtype, f"the numpy backend's {name!r} against scalar_ops.{f.__name__}")
            for va, vb in zip(views(a, dtype), views(b, dtype)[::-1]):
                same(backend.zip(name, va, vb).to_numpy(), expected, dtype, f"{backend.name} zip {name!r}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_reduction_folds_its_zip_op_from_its_start(backend, dtype):
    x = map_inputs()                 # its last row holds inf, -inf and nan
    for name, (zip_op, start) in scalar_ops.REDUCE.items():
        for dim in (0, 1):
            rows = np.moveaxis(x, dim, -1).reshape(-1, x.shape[dim])
            expected = [functools.reduce(scalar_ops.ZIP[zip_op], map(float, row), start) for row in rows]
            expected = np.array(expected, dtype=dtype).reshape(np.delete(x.shape, dim))
            ours = backend.reduce(name, TensorData.from_numpy(x, dtype), dim).to_numpy()
            same(ours.squeeze(dim), expected, dtype, f"{backend.name} reduce {name!r} along {dim}")
