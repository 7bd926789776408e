"""Chapter 09: a tiny ONNX inference engine in numpy.

    from course_lib.infer import InferenceSession
    sess = InferenceSession("model.onnx")                  # a path, bytes or an onnx.ModelProto
    logits, = sess.run(None, {"idx": ids})

- `ir`        Graph, Node, Value: the engine's own small IR
- `load`      load(model) -> Graph (parsed by the onnx package); to_onnx(graph) back
- `validate`  clear errors: unknown ops, malformed graphs, missing or mis-shaped inputs
- `registry`  the op registry, keyed by op name and opset; `ops/` holds the numpy kernels
- `schedule`  topological order and last uses
- `session`   InferenceSession with onnxruntime's API
- `passes`    constant folding, dead nodes, MatMul+Add -> Gemm, Conv+Relu, shape folding
- `fusions`   elementwise regions (GELU) -> one blocked kernel; attention's scaled, masked softmax
- `memory`    the memory plan: peak bytes against the naive plan
- `arena`     keep freed buffers for the next run (malloc's thresholds), as onnxruntime's arena does
- `profile`   a per-op profiler
- `draw`      pictures of graphs through course_lib.viz
- `onnx_backend`  the engine as an onnx.backend for the ONNX conformance suite
- `models`    the course's MLP, CNN (ch. 08), GPT (ch. 04) and Mamba (ch. 05) for export

`answers` (the executor, constant folding, the MatMul + Add fusion) and `ops/linalg`, `ops/shape` (the
gemm, softmax and reshape kernels) hold the course's answers to chapter 09's exercises, each marked
with the exercise it answers: read them once your checks pass.
"""

from .ir import Graph, Node, Value
from .load import load, to_onnx
from .registry import Unsupported, lookup, register, supported_ops
from .schedule import topological_order
from .session import InferenceSession, NodeArg
from .validate import InvalidGraph, InvalidInput, UnknownOp

__all__ = ["Graph", "Node", "Value", "load", "to_onnx", "Unsupported", "lookup", "register", "supported_ops",
           "topological_order", "InferenceSession", "NodeArg", "InvalidGraph", "InvalidInput", "UnknownOp"]
