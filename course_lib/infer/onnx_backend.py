"""The engine as an ONNX backend, so the standard conformance suite (onnx.backend.test) can run it.

An op, attribute or dtype the engine does not support raises unittest.SkipTest: the suite counts
the case as skipped (unsupported) instead of comparing a made-up answer.
"""

import unittest

import numpy as np
from onnx.backend.base import Backend, BackendRep

from .registry import Unsupported
from .session import InferenceSession

# Cases that the engine could run but answers differently from the reference, with the reason.
# They are reported as expected failures, never as passes. Keep this list short and honest.
KNOWN_DIFFERENCES = {}


class CourseRep(BackendRep):
    def __init__(self, session):
        self.session = session

    def run(self, inputs, **kwargs):
        names = [v.name for v in self.session.graph.inputs]
        items = inputs.items() if isinstance(inputs, dict) else zip(names, inputs)
        # a 0-d tensor often comes as a numpy scalar (np.float32(2.0)): the same value as an array
        feeds = {name: np.asarray(x) if isinstance(x, np.generic) else x for name, x in items}
        if len(feeds) != len(names) or not all(isinstance(x, np.ndarray) for x in feeds.values()):
            raise unittest.SkipTest("inputs that are not plain tensors (sequences, optionals, omitted)")
        try:
            return self.session.run(None, feeds)
        except Unsupported as e:
            raise unittest.SkipTest(f"unsupported: {e}") from None


class CourseBackend(Backend):
    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        super().prepare(model, device, **kwargs)
        try:
            return CourseRep(InferenceSession(model))
        except Unsupported as e:
            raise unittest.SkipTest(f"unsupported: {e}") from None

    @classmethod
    def run_model(cls, model, inputs, device="CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device):
        return device == "CPU"


def node_test_case(name=__name__):
    """The unittest.TestCase class holding the ONNX node conformance cases (test_*_cpu methods)."""
    import onnx.backend.test

    suite = onnx.backend.test.BackendTest(CourseBackend, name)
    for pattern in KNOWN_DIFFERENCES:
        suite.xfail(pattern)
    return suite.test_cases["OnnxBackendNodeModelTest"]


__all__ = ["CourseBackend", "CourseRep", "KNOWN_DIFFERENCES", "node_test_case"]
