"""Chapter 07 carried forward: the learner's CUDA kernels as the "yours-cuda" tensor backend.

The whole solutions notebook takes minutes on the simulator, so only the four exercises the
backend uses are saved: a notebook of the solution's set-up cells and those exercises' cells, run
from the workspace's exercises/ as the learner's. Tensors stay small (a few hundred threads a launch).
"""

import carried
import nbformat
import numpy as np
import pytest

from course_lib import device
from course_lib.checks import CheckFailed
from course_lib.course import links, nbtools
from course_lib.learner import answers
from course_lib.tensor.backend import get_backend
from course_lib.tensor.numpy_backend import backend as numpy_backend
from course_lib.tensor.tensor_data import TensorData, slice_view
from course_lib.yours import cuda_backend

EXERCISES = ("zip_add", "row_sum", "matmul_naive", "matmul_tiled")


def save_exercises(workspace, exercises=EXERCISES):
    """Run solutions/07's set-up cells and the named exercises (solution and check) as the learner's."""
    nb = nbformat.read(carried.solution_notebook("07"), as_version=4)
    first = next(i for i, c in enumerate(nb.cells)
                 if c.cell_type == "markdown" and i > 0 and c.get("id") != links.LINKS_ID)  # past the launch links
    cells = nb.cells[:first]
    for i, c in enumerate(nb.cells):
        if "check" in c.metadata.get("tags", []) and c.source.startswith(tuple(f"check.{e}(" for e in exercises)):
            cells += [nb.cells[i - 1], c]
    nb.cells = cells
    (workspace / "exercises").mkdir(parents=True, exist_ok=True)
    nb = nbtools.execute(nb, cwd=workspace / "exercises", allow_errors=True)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, f"{errors[0].ename}: {errors[0].evalue}"
    assert sorted(answers.index("07")) == sorted(exercises)


saved, learner = carried.fixtures("07", save=save_exercises)   # the four exercises saved; a copy per test
payoff = carried.payoff_fixture("07")                            # the payoff run once on them


def test_payoff_runs_the_mlp_on_your_kernels_like_numpy(payoff):
    namespace, text = payoff
    assert ("your matmul_tiled runs matmul; your row_sum runs reduce sum; your zip_add runs zip add (up to 1,024 "
            "elements); the course's kernels run map, the other zips, reduce max, where") in text
    assert f"on the {'simulator' if device.using_simulator() else ''}" in text       # the device line
    assert "logits equal within float32 rounding: True" in text
    assert "gradients equal within float32 rounding: True" in text
    backend = namespace["backend"]
    assert get_backend("yours-cuda") is backend
    assert set(backend.calls) == {"matmul_tiled", "row_sum", "zip_add"}


def test_backend_equals_numpy_on_small_views(payoff):
    backend = payoff[0]["backend"]
    rng = np.random.default_rng(7)
    before = dict(backend.calls)
    for dtype in (np.float32, np.float64):
        permuted = TensorData.from_numpy(rng.uniform(-1, 1, (5, 2, 3)), dtype).permute(1, 2, 0)   # (2, 3, 5)
        sliced = slice_view(TensorData.from_numpy(rng.uniform(-1, 1, (5, 7, 11)), dtype),
                            (slice(1, 3), slice(0, 6, 2), slice(1, 11, 2)))                    # (2, 3, 5)
        row = TensorData.from_numpy(rng.uniform(-1, 1, (5,)), dtype)
        for a, b in [(permuted, sliced), (sliced, row), (row, permuted)]:
            close(backend.zip("add", a, b), numpy_backend.zip("add", a, b))
        for dim in range(3):
            close(backend.reduce("sum", sliced, dim), numpy_backend.reduce("sum", sliced, dim))
        batch = TensorData.from_numpy(rng.uniform(-1, 1, (2, 1, 3, 9)), dtype)        # batch dims broadcast
        w = TensorData.from_numpy(rng.uniform(-1, 1, (2, 11, 9)), dtype).permute(0, 2, 1)   # transposed (2, 9, 11)
        close(backend.matmul(batch, w), numpy_backend.matmul(batch, w))
        out = slice_view(TensorData.zeros((3, 5), dtype), (slice(0, 3, 2),))      # add into a strided out
        backend.zip("add", row, row, out)
        np.testing.assert_allclose(out.to_numpy(), 2 * np.broadcast_to(row.to_numpy(), (2, 5)), rtol=1e-6)
    grew = {k: backend.calls[k] - before.get(k, 0) for k in backend.calls}
    assert grew == {"zip_add": 8, "row_sum": 6, "matmul_tiled": 4, "matmul_naive": 4}, grew


def close(yours_td, numpy_td):
    assert yours_td.shape == numpy_td.shape and yours_td.dtype == numpy_td.dtype
    tol = 1e-5 if yours_td.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(yours_td.to_numpy(), numpy_td.to_numpy(), rtol=tol, atol=tol)


def test_a_wrong_kernel_stops_the_payoff_named(learner):
    carried.break_piece("07", "row_sum", "acc += a[row, col]", "acc += a[row, col] * 2")
    namespace = {}
    with pytest.raises(CheckFailed, match="your saved `row_sum`"):
        carried.run_payoff("07", namespace)
    assert "yours_run" not in namespace                 # stopped in the first cell, before the model ran


def test_switched_off_the_course_kernels_run(saved, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_WORKSPACE", str(saved))
    with carried.switched_off("07"):
        backend = cuda_backend.build()
    assert "none of your kernels" in capsys.readouterr().out
    a = TensorData.from_numpy(np.arange(6.0).reshape(2, 3), np.float32)
    close(backend.zip("add", a, a), numpy_backend.zip("add", a, a))
    close(backend.reduce("sum", a, 1), numpy_backend.reduce("sum", a, 1))
    close(backend.matmul(a, a.permute(1, 0)), numpy_backend.matmul(a, a.permute(1, 0)))
    assert not backend.kernels and not backend.calls
