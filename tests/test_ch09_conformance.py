"""The ONNX node conformance cases: zero wrong answers.

The fast subset builds only the cases of the ops below (the onnx package computes each case's
expected outputs with its reference implementation when a case module is imported: all 1,884
cost about 8 s of CPU, these about 1 s) and runs them as onnx.backend.test would: every case
must pass or be refused as unsupported, never answered wrongly.

benchmarks/ch09_onnx_conformance.py runs the whole suite and writes the committed report; the
whole suite also runs here with --slow.
"""

import importlib
import unittest
import warnings

import numpy as np
import pytest

# the case modules of the onnx package (onnx/backend/test/case/node/<name>.py) in the fast subset:
# the ops of attention, losses, control flow, resizing, scatters, convolutions both ways, norms
SUBSET = ["attention", "rotaryembedding", "linear_attention", "causal_conv_with_state", "negativeloglikelihoodloss",
          "softmax_cross_entropy_loss", "scan", "loop", "if_", "resize", "convtranspose", "col2im", "conv", "gemm",
          "scatternd", "scatterelements", "gathernd", "tensorscatter", "rmsnormalization", "groupnormalization",
          "layernormalization", "unique", "cumsum", "cumprod", "reshape", "softmax", "center_crop_pad",
          "reversesequence", "mod", "spacetodepth", "clip", "rangeop"]


def _run_case(case):
    """'passed', 'unsupported' or 'failed: <why>' for one onnx TestCase, compared as onnx's runner does."""
    from onnx.backend.test.runner import Runner

    from course_lib.infer.onnx_backend import CourseBackend

    try:
        rep = CourseBackend.prepare(case.model)
        for inputs, expected in case.data_sets:
            outputs = rep.run([np.asarray(x) if isinstance(x, np.generic) else x for x in inputs])
            Runner.assert_similar_outputs(expected, outputs, rtol=case.rtol, atol=case.atol)
    except unittest.SkipTest:
        return "unsupported"
    except Exception as e:  # a wrong answer (AssertionError) or a crash: both count as wrong
        return f"failed: {type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
    return "passed"


@pytest.fixture(scope="module")
def subset():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in SUBSET:
            importlib.import_module(f"onnx.backend.test.case.node.{name}")
        from onnx.backend.test.case.node import _NodeTestCases
        return {case.name: _run_case(case) for case in _NodeTestCases}


def test_subset_has_no_wrong_answers(subset):
    bad = {name: outcome for name, outcome in subset.items() if outcome.startswith("failed")}
    assert not bad, f"{len(bad)} of {len(subset)} conformance cases answered wrongly or crashed: {list(bad.items())[:5]}"


def test_subset_passes_the_new_ops(subset):
    """The cases of the ops added to catch up with onnxruntime pass (bfloat16 and preview-domain cases
    stay unsupported)."""
    passed = sum(outcome == "passed" for outcome in subset.values())
    assert passed >= 550, f"only {passed} of {len(subset)} cases of the subset pass"
    for prefix in ("test_attention_4d_gqa", "test_nllloss_NCd1d2d3_sum_weight_high_ii", "test_scan9_sum",
                   "test_resize_downsample_scales_cubic_antialias", "test_convtranspose_output_shape",
                   "test_linear_attention_gated_delta", "test_loop11", "test_scatternd_min"):
        cases = [name for name in subset if name.startswith(prefix)]
        assert cases and all(subset[name] == "passed" for name in cases), {name: subset[name] for name in cases}


@pytest.mark.slow
def test_whole_suite_no_wrong_answers_and_more_passes_than_onnxruntime():
    """Opt-in (--slow): all 1,884 CPU cases; onnxruntime 1.31 passes 1,397 of them on this stack."""
    from course_lib.infer.onnx_backend import node_test_case

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cls = node_test_case()
        names = sorted(n for n in dir(cls) if n.startswith("test_") and n.endswith("_cpu"))
        result = unittest.TestResult()
        unittest.TestSuite(cls(n) for n in names).run(result)
    bad = [(t.id().rsplit(".", 1)[-1], tb.strip().splitlines()[-1]) for t, tb in result.failures + result.errors]
    assert not bad, f"{len(bad)} conformance cases answered wrongly or crashed: {bad[:10]}"
    passed = len(names) - len(result.skipped) - len(result.expectedFailures)
    assert passed > 1397, f"{passed} of {len(names)} node cases pass, not more than onnxruntime's 1,397"


def test_the_harness_catches_a_wrong_kernel(monkeypatch, subset):
    """An RMSNormalization that forgets its scale answers every RMS case wrongly, and _run_case says so."""
    from onnx.backend.test.case.node import _NodeTestCases

    from course_lib.infer.registry import KERNELS

    monkeypatch.setitem(KERNELS, ("", "RMSNormalization"),
                        [(23, lambda x, scale, *, axis=-1, epsilon=1e-5, stash_type=1:
                          x / np.sqrt(np.mean(x * x, axis=axis, keepdims=True) + epsilon), None)])
    cases = [case for case in _NodeTestCases if case.name.startswith("test_rms_normalization")]
    assert cases and all(_run_case(case).startswith("failed") for case in cases if "expanded" not in case.name)
