"""Bigger fusions: whole regions of elementwise ops, and attention's scaled, masked softmax.

    g = fuse_elementwise(g)      # GELU's 9 Mul/Add/Tanh nodes -> one Elementwise node, run block by block
    g = fuse_masked_softmax(g)   # Div by a constant, Where with a constant mask, Softmax -> one node

Both keep the outputs identical: the fused kernels call the same numpy operations in the same order.
What they save is memory traffic: fewer full-size temporaries written and read back.
"""

from .ir import Node
from .schedule import topological_order

# Ops without attributes that act element by element: a block of the input gives that block of the output.
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Log", "Tanh",
               "Erf", "Sigmoid", "Relu"}


def _is_scalar(graph, name):
    return name in graph.initializers and graph.initializers[name].size == 1


def _only_reader(graph, value, readers):
    """The node that alone reads `value` (which is not a graph output), else None."""
    users = readers.get(value, [])
    return users[0] if len(users) == 1 and value not in {v.name for v in graph.outputs} else None


def _grow_region(graph, order, k, taken):
    """Elementwise nodes from order[k] on whose inputs are one source x, scalar constants or values made inside."""
    first = order[k]
    sources = {i for i in first.inputs if not _is_scalar(graph, i)}
    if first.op_type not in ELEMENTWISE or first.attrs or id(first) in taken or len(sources) != 1:
        return None, []
    x = sources.pop()
    region, made = [first], {first.outputs[0]}
    for node in order[k + 1:]:
        if node.op_type in ELEMENTWISE and not node.attrs and id(node) not in taken and \
                any(i in made for i in node.inputs) and \
                all(i in made or i == x or _is_scalar(graph, i) for i in node.inputs):
            region.append(node)
            made.add(node.outputs[0])
    return x, region


def _closed(graph, region, readers):
    """True when every value made in the region, except the last node's, is read only inside it."""
    inside = {id(n) for n in region}
    for node in region[:-1]:
        users = readers.get(node.outputs[0], [])
        if not users or any(id(u) not in inside for u in users) or node.outputs[0] in {v.name for v in graph.outputs}:
            return False
    return True


def _program(graph, x, region):
    """The fused node: inputs x and the constants; attrs `ops` and `args`, two slots per op (-1: none).

    Slot 0 is x, then the constants, then each op's result in order."""
    consts = sorted({i for n in region for i in n.inputs if i != x and _is_scalar(graph, i)})
    slot = {x: 0, **{c: 1 + j for j, c in enumerate(consts)}}
    ops, args = [], []
    for node in region:
        ops.append(node.op_type)
        args += [slot[i] for i in node.inputs] + [-1] * (2 - len(node.inputs))
        slot[node.outputs[0]] = len(slot)
    return Node("Elementwise", [x] + consts, list(region[-1].outputs), {"ops": ops, "args": args},
                region[0].name + f"+{len(region) - 1}", domain="course")


def fuse_elementwise(graph):
    """Each region of two or more elementwise ops that reads one tensor x (and scalar constants) -> one node.

    The region grows along the schedule; if a value made inside is also read outside, the tail is dropped
    until none is. The kernel (ops/fused.py) runs the ops on cache-sized blocks of x."""
    g = graph.copy()
    order, readers = topological_order(g), g.consumers()
    taken, replaced = set(), {}
    for k in range(len(order)):
        x, region = _grow_region(g, order, k, taken)
        while len(region) >= 2 and not _closed(g, region, readers):
            region.pop()
        if len(region) < 2:
            continue
        replaced[id(region[0])] = _program(g, x, region)
        taken.update(id(n) for n in region)
    g.nodes = [replaced.get(id(n), n) for n in g.nodes if id(n) not in taken or id(n) in replaced]
    if replaced:
        g.opsets["course"] = 1
    return g


def fuse_masked_softmax(graph):
    """Softmax(Where(mask, fill, s)) with a constant mask and fill -> MaskedSoftmax; a Div or Mul of s by a
    scalar constant just before it joins too (attention's scores / sqrt(head size)). Opset 13 Softmax only."""
    if graph.opset < 13:
        return graph
    g = graph.copy()
    producers, readers = g.producers(), g.consumers()
    removed, replaced = set(), {}
    for sm in g.nodes:
        where = producers.get(sm.inputs[0]) if sm.op_type == "Softmax" else None
        if where is None or where.op_type != "Where" or _only_reader(g, where.outputs[0], readers) is not sm:
            continue
        mask, fill, s = where.inputs
        if mask not in g.initializers or fill not in g.initializers:
            continue
        inputs, divide = [s, mask, fill, ""], 1
        scale = producers.get(s)
        if scale is not None and scale.op_type in ("Div", "Mul") and _only_reader(g, s, readers) is where:
            t, c = scale.inputs
            if scale.op_type == "Mul" and _is_scalar(g, t):  # c * t = t * c
                t, c = c, t
            if _is_scalar(g, c) and not _is_scalar(g, t):
                inputs, divide = [t, mask, fill, c], int(scale.op_type == "Div")
                removed.add(id(scale))
        replaced[id(sm)] = Node("MaskedSoftmax", inputs, list(sm.outputs),
                                {"axis": sm.attrs.get("axis", -1), "divide": divide}, sm.name + "+mask",
                                domain="course")
        removed.add(id(where))
    g.nodes = [replaced.get(id(n), n) for n in g.nodes if id(n) not in removed]
    if replaced:
        g.opsets["course"] = 1
    return g
