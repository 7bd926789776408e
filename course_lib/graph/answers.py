"""The course's answers to chapter 03's exercises: read each once your check passes.

The library runs these pieces: the gradient rules of `*`, `@` and `sum` (put into ops.py's table of
gradient rules below), reverse mode (`gradients`), and two of the passes (passes.py's `optimize` runs
them). The order every walk uses is order.py's, the executor session.py's Session: answers too.
"""

from course_lib.graph import ops
from course_lib.graph.order import topological_order
from course_lib.graph.rewrite import rewrite


def mul_gradient(node, g):
    """The course's answer to exercise 03.3 (`mul_gradient`): read it once your check passes."""
    a, b = node.inputs
    return [ops.sum_to(g * b, a), ops.sum_to(g * a, b)]


def matmul_gradient(node, g):
    """The course's answer to exercise 03.4 (`matmul_gradient`): read it once your check passes."""
    a, b = node.inputs
    return [g @ ops.transpose(b), ops.transpose(a) @ g]


def sum_gradient(node, g):
    """The course's answer to exercise 03.5 (`sum_gradient`): read it once your check passes.

    The summed dims come back with size 1 (an unknown size as -1), then g is copied along them."""
    a = node.inputs[0]
    axes = ops.axes_of(node.attrs["dim"], len(a.shape))
    kept = tuple(1 if i in axes else -1 if d is None else d for i, d in enumerate(a.shape))
    return [ops.broadcast_like(g if node.attrs["keepdim"] else ops.reshape(g, kept), a)]


def gradients(y, xs, grad_y=None):
    """The course's answer to exercise 03.6 (`gradients`): read it once your check passes.

    Nodes for d(sum of y * grad_y)/dx for each x in xs (grad_y defaults to ones). Nothing is computed:
    the result is more graph, made of the same ops, so it can be run, optimized, drawn and
    differentiated again."""
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


def fold_constants(outputs):
    """The course's answer to exercise 03.7 (`fold_constants`): read it once your check passes.

    Compute now every node whose inputs are all constants."""
    def rule(node):
        if node.inputs and node.op.name != "assign" and all(i.op.name == "constant" for i in node.inputs):
            return ops.constant(node.op.compute(node, *[i.attrs["value"] for i in node.inputs]))
    return rewrite(outputs, rule)


COMMUTATIVE = {"add", "mul"}


def eliminate_common_subexpressions(outputs):
    """The course's answer to exercise 03.8 (`eliminate_common_subexpressions`): read it once your check passes.

    Compute each distinct expression once: later duplicates reuse the first. Two nodes with the same
    signature compute the same value; a signature of None is never merged."""
    def signature(node):
        name = node.op.name
        if name in ("placeholder", "variable", "assign"):
            return None
        if name == "constant":
            v = node.attrs["value"]
            return (name, v.shape, v.tobytes())
        ids = [i.id for i in node.inputs]
        if name in COMMUTATIVE:
            ids.sort()
        return (name, tuple(ids), tuple(sorted((k, repr(v)) for k, v in node.attrs.items())))

    first = {}

    def rule(node):
        key = signature(node)
        return None if key is None else first.setdefault(key, node)
    return rewrite(outputs, rule)


ops.GRADIENT_RULES.update({"mul": mul_gradient, "matmul": matmul_gradient, "sum": sum_gradient})
