"""Every op name of the Numba (CPU) and CUDA backends computes the numpy backend's op.

The Numba backend turns a name into an integer code (its position in MAP_NAMES / ZIP_NAMES)
and branches on the code; the CUDA backend looks the name up in its own table. The inputs
below give every op a different answer, so a code that runs the wrong op cannot pass.
"""

import numpy as np
import pytest

from course_lib.fast.ops import MAP_NAMES, ZIP_NAMES
from course_lib.tensor.backend import MAP_OPS, ZIP_OPS, get_backend
from course_lib.tensor.tensor_data import TensorData

X = np.array([[-1.5, -0.5, 0.25], [0.75, 2.0, 3.0]])  # map: negatives tell id from relu, log from sqrt
A = np.array([[1.0, 2.0, 3.0], [0.5, 2.0, 4.0]])      # zip: equal pairs tell lt from le, gt from ge
B = np.array([[2.0, 2.0, 1.0], [2.0, 0.5, 4.0]])

npb = get_backend("numpy")


def as_views(x):
    """The same values contiguous and as a permuted view (the Numba backend's two code paths)."""
    return [TensorData.from_numpy(x, np.float64), TensorData.from_numpy(x.T, np.float64).permute(1, 0)]


def reference(kind, names):
    with np.errstate(all="ignore"):
        if kind == "map":
            return {op: npb.map(op, as_views(X)[0]).to_numpy() for op in names}
        return {op: npb.zip(op, as_views(A)[0], as_views(B)[0]).to_numpy() for op in names}


@pytest.mark.parametrize("kind, names", [("map", MAP_OPS), ("zip", ZIP_OPS)])
def test_the_inputs_give_every_op_a_different_answer(kind, names):
    ref = reference(kind, names)
    for i, p in enumerate(names):
        for q in list(names)[i + 1:]:
            assert not np.array_equal(ref[p], ref[q], equal_nan=True), f"{p} and {q} agree on these inputs"


def test_the_numba_codes_name_every_op_once():
    assert sorted(MAP_NAMES) == sorted(MAP_OPS) and len(set(MAP_NAMES)) == len(MAP_NAMES)
    assert sorted(ZIP_NAMES) == sorted(ZIP_OPS) and len(set(ZIP_NAMES)) == len(ZIP_NAMES)


@pytest.mark.parametrize("backend", ["numba", "cuda"])
def test_every_op_code_against_numpy(backend):
    be = get_backend(backend)
    maps, zips = reference("map", MAP_OPS), reference("zip", ZIP_OPS)
    for op in MAP_OPS:
        for x in as_views(X):
            np.testing.assert_allclose(be.map(op, x).to_numpy(), maps[op], rtol=1e-12, equal_nan=True,
                                       err_msg=f"{backend} map {op!r}")
    for op in ZIP_OPS:
        for a, b in zip(as_views(A), as_views(B)[::-1]):
            np.testing.assert_allclose(be.zip(op, a, b).to_numpy(), zips[op], rtol=1e-12, equal_nan=True,
                                       err_msg=f"{backend} zip {op!r}")
