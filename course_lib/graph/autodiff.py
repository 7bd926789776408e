"""Symbolic reverse mode: gradients(y, xs) adds nodes that compute dy/dx to the graph.

Nothing is computed here. The result is more graph, made of the same ops, so it can be
run, optimized, drawn, and differentiated again (for second derivatives).
"""

from course_lib.graph import ops
from course_lib.graph.node import topological_order


def gradients(y, xs, grad_y=None):
    """Nodes for d(sum of y * grad_y)/dx for each x in xs (grad_y defaults to ones)."""
    order = topological_order([y])
    # Only nodes that some x flows into can carry a gradient to an x.
    reaches = set(xs)
    for node in order:
        if any(i in reaches for i in node.inputs):
            reaches.add(node)
    adjoint = {y: grad_y if grad_y is not None else ops.ones_like(y)}
    for node in reversed(order):
        g = adjoint.get(node)
        if g is None or not node.inputs or node not in reaches:
            continue
        for inp, gi in zip(node.inputs, node.op.gradient(node, g)):
            if gi is None or inp not in reaches:
                continue
            adjoint[inp] = gi if inp not in adjoint else adjoint[inp] + gi  # sum over every path
    return [adjoint[x] if x in adjoint else ops.zeros_like(x) for x in xs]
