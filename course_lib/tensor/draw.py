"""Draw the graph that autograd recorded behind a tensor (with course_lib.viz.draw_graph)."""

from __future__ import annotations

from course_lib.tensor.autodiff import topological_order
from course_lib.viz import draw_graph


def draw_tensor_graph(root, names: dict | None = None, rankdir: str = "LR"):
    """Boxes are tensors (name and shape), ellipses the Functions that made them."""
    names = {id(t): n for n, t in (names or {}).items()}
    nodes, edges = [], []
    for t in topological_order(root):
        label = names.get(id(t)) or t.name
        shape = "x".join(map(str, t.shape)) or "scalar"
        kind = "output" if t is root else ("param" if t.is_leaf else "value")
        nodes.append({"id": id(t), "label": f"{label} {shape}" if label else shape, "kind": kind})
        if t._fn is not None:
            op = f"op{id(t)}"
            nodes.append({"id": op, "label": t._fn.__name__, "kind": "op"})
            edges.append((op, id(t)))
            for p in t._parents:
                if p.requires_grad:
                    edges.append((id(p), op))
    return draw_graph(nodes, edges, rankdir=rankdir)
