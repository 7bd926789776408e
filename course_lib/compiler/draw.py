"""Pictures of a captured step, before and after fusion, drawn as chapter 03 draws graphs.

Before: one ellipse per node (its op and shape), one box per buffer that comes from outside the step's
ops (an input, state, a constant). After: one box per launch of the program, with the ops it runs; the
kernels generated for fused groups are green, BLAS products yellow, numpy's own calls grey.
"""

from course_lib.compiler.ir import CONST, INPUT, STATE
from course_lib.viz import draw_graph

KIND = {INPUT: "input", STATE: "param", CONST: "const"}


def _shape(shape):
    return "(" + ", ".join(str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def _source_label(buf):
    if buf.kind == CONST and buf.size == 1 and buf.value is not None and buf.dtype.kind == "f":
        return f"{float(buf.value[0]):.4g}"
    return f"{buf.label()}\\n{_shape((buf.size,))}" if buf.kind != INPUT else buf.label()


def draw_nodes(nodes, title=None, rankdir="TB"):
    """The nodes as a graph: ops as ellipses, the buffers they read from outside as boxes."""
    made = {n.out.buffer.id: n for n in nodes if n.out is not None}
    shown, items, edges = set(), [], []
    for n in nodes:
        items.append({"id": f"n{n.id}", "label": f"{n.label()}\\n{_shape(n.shape)}", "kind": "op"})
        for ref in n.inputs:
            producer = made.get(ref.buffer.id)
            if producer is not None and producer.id < n.id:
                edges.append((f"n{producer.id}", f"n{n.id}"))
                continue
            key = f"b{ref.buffer.id}"
            if key not in shown:
                shown.add(key)
                items.append({"id": key, "label": _source_label(ref.buffer), "kind": KIND.get(ref.buffer.kind, "value"),
                              "shape": "box"})
            edges.append((key, f"n{n.id}"))
    return draw_graph(items, edges, rankdir=rankdir, title=title)


COLOR = {"kernel": "#bbf7d0", "matmul": "#fde68a", "island": "#fecaca", "index": "#bfdbfe"}


def draw_program(program, title=None, rankdir="TB", first=None):
    """The program's launches (the first `first` of them) as a graph: one box per launch, its ops inside."""
    launches = [launch for launch in program.launches if launch.group is not None][:first]
    writer = {}
    items, edges = [], []
    for k, launch in enumerate(launches):
        ops = [n.label() for n in launch.nodes]
        body = "\\n".join(ops if len(ops) <= 8 else ops[:7] + [f"... {len(ops) - 7} more"])
        items.append({"id": f"l{k}", "label": f"{launch.kind} {k}\\n{body}", "shape": "box",
                      "color": COLOR.get(launch.kind, "#e5e7eb")})
        for b in launch.inputs:
            if b in writer and writer[b] != k:
                edges.append((f"l{writer[b]}", f"l{k}"))
        for b in launch.outputs:
            writer[b] = k
    return draw_graph(items, list(dict.fromkeys(edges)), rankdir=rankdir, title=title)
