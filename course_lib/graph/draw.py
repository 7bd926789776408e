"""Pictures of graphs, through course_lib.viz.draw_graph."""

from course_lib.graph.node import Graph
from course_lib.graph.order import topological_order
from course_lib.viz import draw_graph

KINDS = {"placeholder": "input", "variable": "param", "constant": "const"}


def _shape(s):
    return "(" + ", ".join("?" if d is None else str(d) for d in s) + ("," if len(s) == 1 else "") + ")"


def label(node):
    if node.op.name == "constant" and node.attrs["value"].size == 1:
        return f"{float(node.attrs['value'].reshape(())):g}"
    if node.op.name in KINDS:
        return f"{node.name}\n{_shape(node.shape)}"
    extra = ", ".join(f"{k}={v}" for k, v in node.attrs.items())
    return f"{node.op.name}({extra})\n{_shape(node.shape)}" if extra else f"{node.op.name}\n{_shape(node.shape)}"


def draw(outputs, title=None, rankdir="LR"):
    """Draw every node the outputs need, inputs to outputs. Given a Graph, draw all of its
    nodes, dead ones included; the nodes nothing reads are drawn as outputs."""
    if isinstance(outputs, Graph):
        used = {i for n in outputs.nodes for i in n.inputs}
        outputs = [n for n in outputs.nodes if n not in used]
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    nodes, edges = [], []
    for n in topological_order(outputs):
        kind = "output" if n in outputs else KINDS.get(n.op.name, "op")
        nodes.append({"id": n.id, "label": label(n), "kind": kind,
                      "shape": "box" if n.op.name in KINDS else "ellipse"})
        edges += [(i.id, n.id) for i in n.inputs]
    return draw_graph(nodes, edges, rankdir=rankdir, title=title)
