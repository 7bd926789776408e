"""The ONNX backend node conformance suite: zero wrong answers, at least 600 passing cases.

benchmarks/ch09_onnx_conformance.py runs the same suite and writes the committed report.
"""

import unittest
import warnings

import pytest


@pytest.fixture(scope="module")
def outcome():
    from course_lib.infer.onnx_backend import node_test_case

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cls = node_test_case()
        names = sorted(n for n in dir(cls) if n.startswith("test_") and n.endswith("_cpu"))
        result = unittest.TestResult()
        unittest.TestSuite(cls(n) for n in names).run(result)
    return names, result


def test_no_wrong_answers(outcome):
    names, result = outcome
    bad = [(t.id().rsplit(".", 1)[-1], tb.strip().splitlines()[-1]) for t, tb in result.failures + result.errors]
    assert not bad, f"{len(bad)} conformance cases answered wrongly or crashed: {bad[:10]}"
    assert not result.unexpectedSuccesses


def test_at_least_600_pass(outcome):
    names, result = outcome
    passed = len(names) - len(result.skipped) - len(result.expectedFailures)
    assert passed >= 600, f"only {passed} of {len(names)} node cases pass"
