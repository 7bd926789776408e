"""Turn the graph under a `Value` into nodes and edges for `course_lib.viz.draw_graph`.

Each value is a box showing its label, data and grad; each op is a small oval between
its inputs and its output, as in micrograd's pictures.
"""



def nodes_under(root):
    """Every node under `root` once, the root first, then by distance from it (breadth first)."""
    order, seen = [root], {id(root)}
    for v in order:
        for child in v._prev:
            if id(child) not in seen:
                seen.add(id(child))
                order.append(child)
    return order


def graph_of(root):
    """(nodes, edges) of the graph under `root`, in the format of draw_graph."""
    nodes, edges = [], []
    order = nodes_under(root)
    name_of = {id(v): f"v{i}" for i, v in enumerate(order)}  # stable ids: position in the walk
    for v in order:
        vid = name_of[id(v)]
        kind = "output" if v is root else ("param" if v.label and not v._op else "value")
        name = f"{v.label} | " if v.label else ""
        nodes.append({"id": vid, "label": f"{name}data {v.data:.4f} | grad {v.grad:.4f}",
                      "kind": kind, "shape": "record"})
        if v._op:
            op = f"**{v._arg}" if v._op == "**" else v._op
            nodes.append({"id": vid + "op", "label": op, "kind": "op"})
            edges.append((vid + "op", vid))
            for child in v._prev:
                edges.append((name_of[id(child)], vid + "op"))
    return nodes, edges


def draw(root, rankdir="LR", title=None):
    """A graphviz picture of the graph under `root` (Jupyter shows it as SVG)."""
    from course_lib.viz import draw_graph

    nodes, edges = graph_of(root)
    return draw_graph(nodes, edges, rankdir=rankdir, title=title)
