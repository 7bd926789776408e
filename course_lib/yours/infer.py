"""Chapter 09: your inference engine, assembled from your exercise answers.

    from course_lib.yours.infer import Engine
    engine = Engine(onnx_bytes)          # prints one line: which pieces are yours
    y, = engine.run(None, {"x": x})      # onnxruntime's API

Your `execute` runs the graph; your `gemm`, `softmax` and `reshape` are its Gemm, Softmax and
Reshape kernels (the course's registry supplies every other op); your `fold_constants` and
`fuse_matmul_add` optimize the graph first. A piece you have not passed is the course's.
Your kernels go in through the registry's declared plug-in point, `registry.override`, for the
engine's own work only: outside it, the registry is the course's.
"""

from course_lib import yours
from course_lib.infer import passes
from course_lib.infer.ir import Graph
from course_lib.infer.load import load
from course_lib.infer.ops import linalg, shape
from course_lib.infer.registry import override
from course_lib.infer.validate import check_feeds, check_graph

REFERENCE = {"execute": passes.run_graph, "gemm": linalg.gemm, "softmax": linalg.softmax, "reshape": shape.reshape,
             "fold_constants": passes.fold_constants, "fuse_matmul_add": passes.fuse_matmul_add}
OPS = {"Gemm": "gemm", "Softmax": "softmax", "Reshape": "reshape"}  # ONNX op -> the exercise's kernel


def kernels(chosen):
    """A block inside which each op in OPS runs the chosen kernel (the registry's own override)."""
    return override({op: chosen[name] for op, name in OPS.items()})


class Engine:
    """An ONNX model (a path, bytes, a ModelProto or a Graph) run by your chapter 09 pieces.

    input_shapes: static input shapes, to fold the exporter's Shape chains first with the course's
    `fold_shapes` (the GPT needs it; the engine then runs those shapes only).
    """

    def __init__(self, model, optimize=True, input_shapes=None):
        self.pieces = yours.pieces("09", REFERENCE)  # checks your saved pieces again; says whose is whose
        graph = model.copy() if isinstance(model, Graph) else load(model)
        check_graph(graph)
        with kernels(self.pieces):
            if input_shapes:
                graph = passes.fold_shapes(graph, input_shapes)
            if optimize:
                graph = self.pieces["fuse_matmul_add"](self.pieces["fold_constants"](graph))
        check_graph(graph)
        self.graph = graph

    def run(self, output_names, feeds):
        """The named outputs (None: all) for {input name: array}, computed by your `execute`."""
        check_feeds(self.graph, feeds)
        with kernels(self.pieces):
            outputs = self.pieces["execute"](self.graph, dict(feeds))
        names = [v.name for v in self.graph.outputs]
        return [outputs[names.index(n)] for n in output_names or names]
