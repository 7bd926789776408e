"""The inference registry's declared plug-in point, `override`: a kernel of one's own runs an op inside the
block, blocks nest (the innermost wins), and leaving a block, by an exception too, restores exactly what
stood before it; outside every block the registry is the course's, and a misspelt op is refused."""

import numpy as np
import pytest
import torch

from course_lib.infer import registry
from course_lib.infer.load import load
from course_lib.infer.models import MLP, export
from course_lib.infer.ops import linalg
from course_lib.infer.passes import run_graph
from course_lib.infer.registry import lookup, override


def doubled_gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    return 2 * linalg.gemm(a, b, c, alpha=alpha, beta=beta, transA=transA, transB=transB)


def tripled_gemm(a, b, c=None, **attrs):
    return 3 * linalg.gemm(a, b, c, **attrs)


def course_state():
    return {key: list(versions) for key, versions in registry.KERNELS.items()}, dict(registry._OVERRIDES)


def test_an_override_runs_the_op_in_the_block_and_only_there():
    before = course_state()
    with override({"Gemm": doubled_gemm}):
        fn, accepted = lookup("Gemm", 17)
        assert fn is doubled_gemm and accepted == {"alpha", "beta", "transA", "transB"}
        assert lookup("Softmax", 17)[0] is linalg.softmax      # an op not named keeps the course's
    assert lookup("Gemm", 17)[0] is linalg.gemm
    assert course_state() == before                              # the versions themselves were never edited


def test_blocks_nest_and_each_exit_restores_the_one_outside_it():
    with override({"Gemm": doubled_gemm}):
        with override({"Gemm": tripled_gemm, "Softmax": linalg.softmax}):
            assert lookup("Gemm", 17) == (tripled_gemm, None)   # **attrs: it takes any attribute
        assert lookup("Gemm", 17)[0] is doubled_gemm
        assert ("", "Softmax") not in registry._OVERRIDES
    assert lookup("Gemm", 17)[0] is linalg.gemm and not registry._OVERRIDES


def test_an_exception_inside_the_block_still_restores_the_registry():
    before = course_state()
    with override({"Gemm": doubled_gemm}):
        with pytest.raises(ZeroDivisionError):
            with override({"Gemm": tripled_gemm}):
                1 / 0
        assert lookup("Gemm", 17)[0] is doubled_gemm
    assert course_state() == before


def test_an_unknown_op_is_refused_and_changes_nothing():
    with pytest.raises(KeyError, match="Gemmm"):
        with override({"Gemm": doubled_gemm, "Gemmm": doubled_gemm}):
            pass
    assert lookup("Gemm", 17)[0] is linalg.gemm and not registry._OVERRIDES


def test_an_older_opset_keeps_its_own_kernel():
    (old, old_kernel, _), (new, _, _) = registry.KERNELS[("", "Softmax")]   # Softmax-1 and Softmax-13
    with override({"Softmax": tripled_gemm}):
        assert lookup("Softmax", new)[0] is tripled_gemm and lookup("Softmax", 17)[0] is tripled_gemm
        assert lookup("Softmax", old)[0] is old_kernel and lookup("Softmax", new - 1)[0] is old_kernel


def test_a_graph_run_inside_the_block_calls_the_override(mlp_graph):
    model, graph, x = mlp_graph
    course, = run_graph(graph, {"x": x})
    with override({"Gemm": doubled_gemm}):
        doubled, = run_graph(graph, {"x": x})
    again, = run_graph(graph, {"x": x})
    with torch.no_grad():   # the oracle: the PyTorch model with every linear layer's output doubled
        h = torch.from_numpy(x).double()
        for layer in model.layers:
            h = torch.relu(2 * layer.double()(h))
        expected = (2 * model.head.double()(h)).numpy()
    np.testing.assert_allclose(doubled, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(again, course)
    assert np.abs(doubled - course).max() > 0.1


@pytest.fixture(scope="module")
def mlp_graph():
    torch.manual_seed(0)
    model = MLP()
    onx = export(model, torch.randn(2, 64), ["x"], ["logits"], {"x": {0: "batch"}})
    return model, load(onx), np.random.default_rng(3).standard_normal((5, 64)).astype(np.float32)
