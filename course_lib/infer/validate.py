"""Validation: refuse a graph or a feed early, with an error that names the culprit."""

import numpy as np

from .registry import Unsupported, lookup


class InvalidGraph(ValueError):
    """The graph is malformed: a value read before anything writes it, written twice, a cycle..."""


class InvalidInput(ValueError):
    """A feed is missing, unknown, or has the wrong dtype or shape."""


class UnknownOp(Unsupported):
    """No kernel exists for a node's op at the model's opset."""


def _tensor_type_ok(v):
    return v.dtype is None or v.dtype.kind in "biuf"  # None: the file does not say, the kernels will


def check_graph(graph):
    """Raise UnknownOp / Unsupported / InvalidGraph unless every node can run on defined values."""
    for v in graph.inputs + graph.outputs:
        if not _tensor_type_ok(v):
            raise Unsupported(f"value {v.name!r} is not a numeric tensor (dtype {v.dtype}); "
                              "sequences, optionals and strings are not supported")
    defined = {v.name for v in graph.inputs} | set(graph.initializers)
    written = {}
    for node in graph.nodes:
        where = f"node {node.name or node.op_type!r} ({node.op_type})"
        try:
            _, accepted = lookup(node.op_type, graph.opsets.get(node.domain or "", graph.opset), node.domain)
        except Unsupported as e:
            raise UnknownOp(f"{e}, in {where}, opset {graph.opsets.get(node.domain or '', graph.opset)}") from None
        if accepted is not None:
            extra = set(node.attrs) - accepted
            if extra:
                raise Unsupported(f"{where} has attributes the kernel does not know: {sorted(extra)}")
        for out in node.outputs:
            if out and (out in written or out in defined):
                raise InvalidGraph(f"malformed graph: value {out!r} is written twice (by {where})")
            if out:
                written[out] = node
    available = defined | set(written)
    for node in graph.nodes:
        for i in node.inputs:
            if i and i not in available:
                raise InvalidGraph(f"malformed graph: node {node.name or node.op_type!r} ({node.op_type}) reads "
                                   f"{i!r}, which no node, graph input or initializer provides")
    for v in graph.outputs:
        if v.name not in available:
            raise InvalidGraph(f"malformed graph: graph output {v.name!r} is never computed")


def check_feeds(graph, feeds):
    """Raise InvalidInput unless `feeds` gives every graph input with its dtype and a matching shape."""
    names = [v.name for v in graph.inputs]
    missing = [n for n in names if n not in feeds]
    if missing:
        raise InvalidInput(f"missing inputs: {missing} (the model's inputs are {names})")
    unknown = [n for n in feeds if n not in names]
    if unknown:
        raise InvalidInput(f"unknown inputs: {unknown} (the model's inputs are {names})")
    for v in graph.inputs:
        x = feeds[v.name]
        if not isinstance(x, np.ndarray):
            raise InvalidInput(f"input {v.name!r} must be a numpy array, got {type(x).__name__}")
        if v.dtype is not None and x.dtype != v.dtype:
            raise InvalidInput(f"input {v.name!r} has dtype {x.dtype}, the model expects {v.dtype}")
        if v.shape is not None:
            ok = len(x.shape) == len(v.shape) and all(
                not isinstance(d, int) or d == s for d, s in zip(v.shape, x.shape))
            if not ok:
                raise InvalidInput(f"input {v.name!r} has shape {x.shape}, the model expects {v.shape} "
                                   "(a name or None is a dynamic axis)")
