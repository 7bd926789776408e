"""Chapter 03's checks pass on the reference and reject plausible mistakes."""

import numpy as np
import pytest
from checking import expect_failure

from course_lib import graph as G
from course_lib.checks import ch03 as check
from course_lib.graph import ops

# ---- reference answers (as a learner would write them) ----

def topo_ref(outputs):
    return G.topological_order(outputs)


def run_ref(fetches, feed):
    values = {}
    for node in G.topological_order(fetches):
        if node.op.name == "placeholder":
            values[node] = np.asarray(feed[node], dtype=float)
        elif node.op.name == "variable":
            values[node] = node.attrs["init"]
        else:
            values[node] = node.op.compute(node, *[values[i] for i in node.inputs])
    return [values[f] for f in fetches]


def mul_ref(node, g):
    a, b = node.inputs
    return [ops.sum_to(g * b, a), ops.sum_to(g * a, b)]


def matmul_ref(node, g):
    a, b = node.inputs
    return [g @ b.T, a.T @ g]


def sum_ref(node, g):
    return node.op.gradient(node, g)


def train_ref(sess, loss, train_ops, feed, steps):
    return [sess.run([loss] + train_ops, feed)[0] for _ in range(steps)]


def test_references_pass():
    check.topological_order(topo_ref)
    check.run_graph(run_ref)
    check.mul_gradient(mul_ref)
    check.matmul_gradient(matmul_ref)
    check.sum_gradient(sum_ref)
    check.gradients(G.gradients)
    check.fold_constants(G.fold_constants)
    check.eliminate_common_subexpressions(G.eliminate_common_subexpressions)
    check.training_loop(train_ref)


# ---- wrong answers ----

def topo_recursive(outputs):
    order, seen = [], set()

    def visit(n):
        if n in seen:
            return
        seen.add(n)
        for i in n.inputs:
            visit(i)
        order.append(n)
    for o in outputs:
        visit(o)
    return order


def topo_whole_graph(outputs):
    return list(G.default_graph().nodes)  # every node defined, needed or not


def topo_no_seen(outputs):
    order = []
    stack = [(o, False) for o in outputs]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
        else:
            stack.append((n, True))
            stack.extend((i, False) for i in n.inputs)
    return order


def topo_preorder(outputs):
    return list(reversed(G.topological_order(outputs)))


@pytest.mark.parametrize("wrong, hint", [(topo_recursive, "RecursionError"), (topo_whole_graph, "do not need"),
                                         (topo_no_seen, "more than once"), (topo_preorder, "before its input")])
def test_topo_order_rejects(wrong, hint):
    expect_failure(check.topological_order, wrong, match=hint)


def run_everything(fetches, feed):
    graph = G.default_graph()
    values = {}
    for node in graph.nodes:
        if node.op.name == "placeholder":
            values[node] = feed[node]
        elif node.op.name == "variable":
            values[node] = node.attrs["init"]
        else:
            values[node] = node.op.compute(node, *[values[i] for i in node.inputs])
    return [values[f] for f in fetches]


def run_variables_as_zero(fetches, feed):
    values = {}
    for node in G.topological_order(fetches):
        if node.op.name == "placeholder":
            values[node] = feed[node]
        elif node.op.name == "variable":
            values[node] = np.zeros(node.shape)
        else:
            values[node] = node.op.compute(node, *[values[i] for i in node.inputs])
    return [values[f] for f in fetches]


@pytest.mark.parametrize("wrong, hint", [(run_everything, "do not need"), (run_variables_as_zero, "differs")])
def test_run_graph_rejects(wrong, hint):
    expect_failure(check.run_graph, wrong, match=hint)


@pytest.mark.parametrize("wrong, hint", [
    (lambda node, g: [g * node.inputs[1], g * node.inputs[0]], "shape"),
    (lambda node, g: [ops.sum_to(g * node.inputs[0], node.inputs[0]), ops.sum_to(g * node.inputs[1], node.inputs[1])],
     "swapped"),
    (lambda node, g: [ops.sum_to(g * node.inputs[1], node.inputs[0])], "one gradient node per input"),
])
def test_mul_gradient_rejects(wrong, hint):
    expect_failure(check.mul_gradient, wrong, match=hint)


@pytest.mark.parametrize("wrong", [
    lambda node, g: [g @ node.inputs[1], node.inputs[0] @ g],
    lambda node, g: [g @ node.inputs[1].T, node.inputs[0] @ g.T],
    lambda node, g: [node.inputs[1].T @ g, g @ node.inputs[0].T],
])
def test_matmul_gradient_rejects(wrong):
    expect_failure(check.matmul_gradient, wrong)


def sum_ignoring_keepdim(node, g):
    a = node.inputs[0]
    return [ops.broadcast_like(g, a)]


def sum_without_negative_dims(node, g):
    """Right for dims >= 0, but -1 never equals a position, so negative dims are not put back."""
    a = node.inputs[0]
    dim, keepdim = node.attrs["dim"], node.attrs["keepdim"]
    if not keepdim:
        dims = range(len(a.shape)) if dim is None else (dim if isinstance(dim, tuple) else (dim,))
        g = ops.reshape(g, [1 if i in dims else s for i, s in enumerate(a.shape)])
    return [ops.broadcast_like(g, a)]


@pytest.mark.parametrize("wrong", [lambda node, g: [g], sum_ignoring_keepdim,
                                   lambda node, g: [ops.broadcast_like(g * 2.0, node.inputs[0])]])
def test_sum_gradient_rejects(wrong):
    expect_failure(check.sum_gradient, wrong)


def test_sum_gradient_rejects_positive_dims_only():
    expect_failure(check.sum_gradient, sum_without_negative_dims, match="negative")


def gradients_forward_order(y, xs):
    adj = {y: ops.ones_like(y)}
    for node in G.topological_order([y]):
        if node in adj and node.inputs:
            for inp, gi in zip(node.inputs, node.op.gradient(node, adj[node])):
                if gi is not None:
                    adj[inp] = adj[inp] + gi if inp in adj else gi
    return [adj.get(x, ops.zeros_like(x)) for x in xs]


@pytest.mark.parametrize("wrong, hint", [(check._overwriting_gradients, "SUM of the gradients"),
                                         (gradients_forward_order, "differs")])
def test_gradients_rejects(wrong, hint):
    expect_failure(check.gradients, wrong, match=hint)


def fold_through_variables(outputs):
    def rule(node):
        leaves = ("constant", "variable")
        if node.inputs and node.op.name != "assign" and all(i.op.name in leaves for i in node.inputs):
            vals = [i.attrs["value"] if i.op.name == "constant" else i.attrs["init"] for i in node.inputs]
            return ops.constant(node.op.compute(node, *vals))
    return G.passes.rewrite(outputs, rule)


def fold_only_binary(outputs):
    def rule(node):
        if len(node.inputs) == 2 and all(i.op.name == "constant" for i in node.inputs):
            return ops.constant(node.op.compute(node, *[i.attrs["value"] for i in node.inputs]))
    return G.passes.rewrite(outputs, rule)


def fold_any_constant_input(outputs):
    """`any` for `all`: folds x * 2.0 too, and crashes on x's missing value."""
    def rule(node):
        if node.inputs and node.op.name != "assign" and any(i.op.name == "constant" for i in node.inputs):
            return ops.constant(node.op.compute(node, *[i.attrs["value"] for i in node.inputs]))
    return G.passes.rewrite(outputs, rule)


def fold_placeholders_as_zeros(outputs):
    """Treats a placeholder as a constant zero, so x * 2.0 becomes a constant."""
    def value(i):
        return i.attrs["value"] if i.op.name == "constant" else np.zeros(i.shape)

    def rule(node):
        if node.inputs and node.op.name != "assign" and all(i.op.name in ("constant", "placeholder")
                                                            for i in node.inputs):
            return ops.constant(node.op.compute(node, *[value(i) for i in node.inputs]))
    return G.passes.rewrite(outputs, rule)


def fold_first_input_only(outputs):
    """Looks at the first input only: right when constants sit on the right (x * 2.0), wrong for 2.0 * x."""
    def rule(node):
        if node.inputs and node.op.name != "assign" and node.inputs[0].op.name == "constant":
            return ops.constant(node.op.compute(node, *[i.attrs.get("value") for i in node.inputs]))
    return G.passes.rewrite(outputs, rule)


@pytest.mark.parametrize("wrong, hint", [(fold_first_input_only, "reads placeholder x1"),
                                         (fold_through_variables, "variable v"),
                                         (fold_any_constant_input, "reads placeholder x"),
                                         (fold_placeholders_as_zeros, "that depend on placeholder x"),
                                         (fold_only_binary, "down to"), (lambda outs: outs, "down to")])
def test_fold_constants_rejects(wrong, hint):
    expect_failure(check.fold_constants, wrong, match=hint)


def cse_with(signature):
    def cse(outputs):
        first = {}

        def rule(node):
            key = signature(node)
            return None if key is None else first.setdefault(key, node)
        return G.passes.rewrite(outputs, rule)
    return cse


def sig_ignoring_attrs(node):
    if node.op.name in ("placeholder", "variable", "assign"):
        return None
    if node.op.name == "constant":
        return ("c", node.attrs["value"].tobytes(), node.attrs["value"].shape)
    return (node.op.name, tuple(i.id for i in node.inputs))


def sig_unordered(node):
    if node.op.name in ("placeholder", "variable", "assign", "constant"):
        return None if node.op.name != "constant" else ("c", node.attrs["value"].tobytes(), node.attrs["value"].shape)
    return (node.op.name, tuple(sorted(i.id for i in node.inputs)), repr(sorted(node.attrs.items())))


def sig_constants_by_identity(node):
    if node.op.name in ("placeholder", "variable", "assign", "constant"):
        return None
    return (node.op.name, tuple(i.id for i in node.inputs), repr(sorted(node.attrs.items())))


def sig_matmul_commutative(node):
    """Sorts the inputs of matmul too, as if a @ b were b @ a."""
    if node.op.name in ("placeholder", "variable", "assign"):
        return None
    if node.op.name == "constant":
        return ("c", node.attrs["value"].shape, node.attrs["value"].tobytes())
    ids = [i.id for i in node.inputs]
    if node.op.name in ("add", "mul", "matmul"):
        ids.sort()
    return (node.op.name, tuple(ids), repr(sorted(node.attrs.items())))


def sig_merges_placeholders(node):
    """Forgets that placeholders are inputs: two of one shape look alike and are merged."""
    if node.op.name in ("variable", "assign"):
        return None
    if node.op.name == "constant":
        return ("c", node.attrs["value"].shape, node.attrs["value"].tobytes())
    ids = [i.id for i in node.inputs]
    if node.op.name in ("add", "mul"):
        ids.sort()
    return (node.op.name, tuple(ids), repr(sorted(node.attrs.items())))


def sig_merges_variables(node):
    """Compares variables by their initial value, as if they were constants: two equal ones are merged."""
    if node.op.name in ("placeholder", "assign"):
        return None
    if node.op.name in ("constant", "variable"):
        value = node.attrs["value" if node.op.name == "constant" else "init"]
        return (node.op.name, value.shape, value.tobytes())
    ids = [i.id for i in node.inputs]
    if node.op.name in ("add", "mul"):
        ids.sort()
    return (node.op.name, tuple(ids), repr(sorted(node.attrs.items())))


@pytest.mark.parametrize("wrong, hint", [(cse_with(sig_ignoring_attrs), ""), (cse_with(sig_unordered), "differs"),
                                         (cse_with(sig_constants_by_identity), "down to"),
                                         (cse_with(sig_matmul_commutative), "differs"),
                                         (cse_with(sig_merges_placeholders), "no longer reads placeholder x"),
                                         (cse_with(sig_merges_variables), "no longer reads variable v")])
def test_cse_rejects(wrong, hint):
    expect_failure(check.eliminate_common_subexpressions, wrong, match=hint)


def train_late(sess, loss, train_ops, feed, steps):
    out = []
    for _ in range(steps):
        sess.run(train_ops, feed)
        out.append(sess.run(loss, feed))
    return out


def train_new_session(sess, loss, train_ops, feed, steps):
    return [G.Session().run([loss] + train_ops, feed)[0] for _ in range(steps)]


@pytest.mark.parametrize("wrong, hint", [(train_late, "one step late"), (train_new_session, "never changes"),
                                         (lambda s, l, t, f, n: [s.run(l, f) for _ in range(n)], "never changes")])
def test_training_loop_rejects(wrong, hint):
    expect_failure(check.training_loop, wrong, match=hint)
