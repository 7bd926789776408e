"""Run the ONNX backend node conformance suite on the course's engine and write the report.

    .venv/bin/python benchmarks/ch09_onnx_conformance.py            # writes benchmarks/ch09_onnx_conformance.md

The suite is onnx.backend.test.BackendTest with course_lib.infer.onnx_backend.CourseBackend. The
installed onnx builds its node cases in memory (no data folder). A case counts as:
  passed       the engine's outputs match the reference within the case's tolerance;
  failed       a wrong answer or a crash (the goal is zero);
  unsupported  the engine refused it (unknown op, attribute, dtype): skipped, never answered;
  expected     listed in KNOWN_DIFFERENCES (expected failures, with the reason).
Only the CPU variants count; the CUDA duplicates are skipped by the backend.

    .venv/bin/python benchmarks/ch09_onnx_conformance.py --peer     # and onnxruntime on the same cases

With --peer, onnxruntime (its InferenceSession behind the same kind of Backend, numpy scalars fed as
0-d arrays, as the engine's are) runs every case too, and the report gives both counts. For
onnxruntime an error counts as not passed: it does not say whether a case is unsupported or wrong.
"""

import collections
import sys
import time
import unittest
import warnings
from pathlib import Path

import onnx

REPORT = Path(__file__).with_suffix(".md")


def peer_passes():
    """How many CPU node cases onnxruntime passes, run by onnx.backend.test like the engine."""
    import numpy as np
    import onnx.backend.test
    import onnxruntime as ort
    from onnx.backend.base import Backend, BackendRep

    class OrtRep(BackendRep):
        def __init__(self, session):
            self.session = session

        def run(self, inputs, **kwargs):
            names = [i.name for i in self.session.get_inputs()]
            feeds = dict(inputs.items()) if isinstance(inputs, dict) else dict(zip(names, inputs))
            feeds = {k: np.asarray(v) if isinstance(v, np.generic) else v for k, v in feeds.items()}
            return [np.asarray(v) if isinstance(v, np.generic) else v for v in self.session.run(None, feeds)]

    class OrtBackend(Backend):
        @classmethod
        def prepare(cls, model, device="CPU", **kwargs):
            options = ort.SessionOptions()
            options.log_severity_level = 4
            return OrtRep(ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]))

        @classmethod
        def run_model(cls, model, inputs, device="CPU", **kwargs):
            return cls.prepare(model, device, **kwargs).run(inputs)

        @classmethod
        def supports_device(cls, device):
            return device == "CPU"

    cls = onnx.backend.test.BackendTest(OrtBackend, "peer").test_cases["OnnxBackendNodeModelTest"]
    names = sorted(n for n in dir(cls) if n.startswith("test_") and n.endswith("_cpu"))
    result = unittest.TestResult()
    unittest.TestSuite(cls(n) for n in names).run(result)
    return len(names) - len(result.failures) - len(result.errors) - len(result.skipped), ort.__version__


def run():
    from onnx.backend.test.loader import load_model_tests

    from course_lib.infer.onnx_backend import KNOWN_DIFFERENCES, node_test_case

    warnings.filterwarnings("ignore")
    ops = {f"{t.name}_cpu": sorted({n.op_type for n in t.model.graph.node}) for t in load_model_tests(kind="node")}
    cls = node_test_case()
    names = sorted(n for n in dir(cls) if n.startswith("test_") and n.endswith("_cpu"))
    result = unittest.TestResult()
    t0 = time.perf_counter()
    unittest.TestSuite(cls(n) for n in names).run(result)
    seconds = time.perf_counter() - t0
    outcome = {n: "passed" for n in names}
    reason = {}
    for test, msg in result.skipped:
        outcome[test._testMethodName], reason[test._testMethodName] = "unsupported", msg
    for test, tb in result.failures + result.errors:
        outcome[test._testMethodName], reason[test._testMethodName] = "failed", tb.strip().splitlines()[-1]
    for test, tb in result.expectedFailures:
        outcome[test._testMethodName] = "expected"
    for test in result.unexpectedSuccesses:
        outcome[test._testMethodName] = "passed"
    return names, outcome, reason, ops, seconds, KNOWN_DIFFERENCES


def write(names, outcome, reason, ops, seconds, known, peer=None):
    count = collections.Counter(outcome.values())
    by_op = collections.defaultdict(collections.Counter)
    for n in names:
        key = ops.get(n, ["?"])[0] if len(ops.get(n, [])) == 1 else "(multi-op: expanded functions)"
        by_op[key][outcome[n]] += 1
    why = collections.Counter(reason[n].split(", in node")[0][:90] for n in names if outcome[n] == "unsupported")
    lines = [
        "# ONNX backend conformance of `course_lib.infer` (chapter 09)",
        "",
        f"onnx {onnx.__version__}, node test cases built in memory by `onnx.backend.test.BackendTest`, CPU variants.",
        f"Regenerate with `.venv/bin/python benchmarks/ch09_onnx_conformance.py` ({seconds:.0f} s of running "
        "after the cases are built).",
        "",
        "| outcome | cases |",
        "|---|---:|",
        f"| passed | {count['passed']} |",
        f"| failed (wrong answer or crash) | {count['failed']} |",
        f"| unsupported (skipped: op, attribute or dtype the engine refuses) | {count['unsupported']} |",
        f"| expected failures (listed in `KNOWN_DIFFERENCES`) | {count['expected']} |",
        f"| total | {len(names)} |",
        "",
    ]
    if peer is not None:
        lines += [f"onnxruntime {peer[1]} passes {peer[0]} of the same {len(names)} cases in the same run "
                  f"(`--peer`); the engine passes {count['passed']}.", ""]
    if known:
        lines += ["## Expected failures", ""] + [f"- `{k}`: {v}" for k, v in known.items()] + [""]
    failed = [n for n in names if outcome[n] == "failed"]
    if failed:
        lines += ["## Failed", ""] + [f"- `{n}`: {reason[n]}" for n in failed] + [""]
    lines += ["## Why cases are unsupported (most common first)", "", "| cases | reason |", "|---:|---|"]
    lines += [f"| {c} | {r.replace('|', '/')} |" for r, c in why.most_common()]
    lines += ["", "## By op (single-op cases; expanded function cases grouped)", "",
              "| op | passed | unsupported | failed | expected |", "|---|---:|---:|---:|---:|"]
    for op in sorted(by_op):
        c = by_op[op]
        lines.append(f"| {op} | {c['passed']} | {c['unsupported']} | {c['failed']} | {c['expected']} |")
    REPORT.write_text("\n".join(lines) + "\n")
    return count


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    outcome = run()
    peer = peer_passes() if "--peer" in sys.argv else None
    count = write(*outcome, peer=peer)
    print(f"passed {count['passed']}, failed {count['failed']}, unsupported {count['unsupported']}, "
          f"expected {count['expected']}; report in {REPORT}")
    if peer:
        print(f"onnxruntime {peer[1]}: passed {peer[0]} of the same cases")
