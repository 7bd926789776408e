"""Pictures of a Graph through course_lib.viz.draw_graph: ops as ellipses, inputs and outputs as boxes."""

from course_lib.viz import draw_graph


def draw(graph, title=None, show_params=False, rankdir="TB"):
    """Draw the graph. Edges carry value names; constants (initializers) are hidden unless show_params."""
    # graphviz reads "a:b" as node a, port b: ids are plain i0, o0, n0, p0_1
    nodes = [{"id": f"i{k}", "label": f"{v.name}\n{tuple(v.shape) if v.shape else ''}", "kind": "input"}
             for k, v in enumerate(graph.inputs)]
    nodes += [{"id": f"o{k}", "label": v.name, "kind": "output"} for k, v in enumerate(graph.outputs)]
    source = {v.name: f"i{k}" for k, v in enumerate(graph.inputs)}
    edges = []
    for k, n in enumerate(graph.nodes):
        nid = f"n{k}"
        label = n.op_type if not n.domain else f"{n.op_type}\n({n.domain})"
        fused = {"color": "#c7d2fe"} if n.domain else {}  # fused ops of our own domain stand out
        nodes.append({"id": nid, "label": label, "kind": "op", **fused})
        for o in n.outputs:
            source[o] = nid
    for k, n in enumerate(graph.nodes):
        for i in n.inputs:
            if i in source:
                edges.append((source[i], f"n{k}", _short(i)))
            elif i in graph.initializers and show_params:
                pid = f"p{k}_{len(nodes)}"
                nodes.append({"id": pid, "label": f"{_short(i)}\n{graph.initializers[i].shape}", "kind": "param"})
                edges.append((pid, f"n{k}"))
    for k, v in enumerate(graph.outputs):
        if v.name in source:
            edges.append((source[v.name], f"o{k}"))
    return draw_graph(nodes, edges, rankdir=rankdir, title=title)


def _short(name, n=18):
    return name if len(name) <= n else "…" + name[-n + 1:]
