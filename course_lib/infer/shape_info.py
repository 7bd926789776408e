"""What onnx's shape inference can tell about a graph's values before anything runs: their ranks."""

import onnx

from .load import to_onnx


def value_ranks(graph):
    """The rank of every value that onnx's shape inference can work out (dynamic sizes are fine)."""
    try:
        model = onnx.shape_inference.infer_shapes(to_onnx(graph))
    except Exception:
        return {}
    ranks = {}
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            ranks[vi.name] = len(t.shape.dim)
    ranks.update({k: v.ndim for k, v in graph.initializers.items()})
    return ranks
