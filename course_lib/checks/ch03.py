"""Checks for chapter 03, graph mode: executor, gradient rules, gradients(), passes, training."""

import numpy as np
import torch

from course_lib import graph as G
from course_lib.checks import CheckFailed, assert_close, exercise, fmt, require, rng
from course_lib.graph import ops

# ---- random graphs, and the same graphs evaluated by torch (the oracle) --------------------

_TORCH = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "exp": lambda a: torch.exp(torch.tanh(a)),
          "sigmoid": torch.sigmoid, "sum": lambda a: a.sum()}


def _random_dag(n_inputs=3, n_ops=12, size=None):
    """Placeholders of one odd size and ops drawn at random, reusing earlier nodes (diamonds)."""
    size = size or int(rng().choice([3, 5, 7]))
    xs = [G.placeholder((size,), name=f"x{i}") for i in range(n_inputs)]
    nodes, recipe = list(xs), []
    for _ in range(n_ops):
        kind = str(rng().choice(["add", "sub", "mul", "mul", "exp", "sigmoid"]))
        a = nodes[int(rng().integers(len(nodes)))]
        if kind in ("exp", "sigmoid"):
            node = G.exp(a.sigmoid() * 2.0 - 1.0) if kind == "exp" else a.sigmoid()
            recipe.append((kind, nodes.index(a), None))
        else:
            b = nodes[int(rng().integers(len(nodes)))]
            node = getattr(ops, kind)(a, b)
            recipe.append((kind, nodes.index(a), nodes.index(b)))
        nodes.append(node)
    y = (nodes[-1] * nodes[-2] + nodes[-3]).sum()
    return xs, nodes, y, recipe, size


def _torch_eval(recipe, values):
    ts = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in values]
    nodes = list(ts)
    for kind, i, j in recipe:
        a = nodes[i]
        if kind == "exp":
            nodes.append(torch.exp(torch.sigmoid(a) * 2.0 - 1.0))
        elif kind == "sigmoid":
            nodes.append(torch.sigmoid(a))
        else:
            nodes.append(_TORCH[kind](a, nodes[j]))
    return ts, (nodes[-1] * nodes[-2] + nodes[-3]).sum()


class _Spy(ops.Op):
    """An op that records when it is computed: it must not be, outside a fetch's subgraph."""
    name = "spy"

    def __init__(self):
        self.calls = 0

    def compute(self, node, a):
        self.calls += 1
        return a


# ---- 1. topological order -------------------------------------------------------------------

def _needed(fetches):
    """The oracle: the set of nodes the fetches depend on, by a breadth-first walk over inputs."""
    found, frontier = set(fetches), list(fetches)
    while frontier:
        frontier = [i for n in frontier for i in n.inputs if i not in found]
        found.update(frontier)
    return found


@exercise
def topological_order(your_topological_order):
    for trial in range(4):
        with G.Graph():
            xs, nodes, y, _, _ = _random_dag(n_ops=10 + trial * 3)
            _extra = (nodes[3] * 5.0).exp()  # not needed by y
            fetches = [y] if trial % 2 == 0 else [y, nodes[5]]
            yours = your_topological_order(fetches)
        require(isinstance(yours, list), f"topological_order should return a list of nodes, got {type(yours).__name__}.")
        names = [getattr(n, "name", n) for n in yours]
        dupes = {n for n in names if names.count(n) > 1}
        require(not dupes, f"these nodes appear more than once: {sorted(dupes)}.",
                hint="a node reached by two paths (a diamond) must be listed once.")
        expected = _needed(fetches)
        outside = [n.name for n in yours if n not in expected]
        require(not outside, f"your order includes nodes the fetches do not need: {outside}.",
                hint="walk backwards from the fetches through inputs only; never list the whole graph.")
        missing = [n.name for n in expected if n not in set(yours)]
        require(not missing, f"your order misses nodes the fetches need: {missing}.")
        position = {n: i for i, n in enumerate(yours)}
        for n in yours:
            for i in n.inputs:
                require(position[i] < position[n],
                        f"{n.name} comes before its input {i.name}: every node must come after all of its inputs.",
                        hint="append a node only after all its inputs are done (post-order).")
    with G.Graph():
        x = G.placeholder(())
        y = x
        for _ in range(20_000):
            y = y * 1.5
    try:
        order = your_topological_order([y])
    except RecursionError:
        raise CheckFailed("RecursionError on a chain of 20,000 nodes: Python's stack is too shallow for a "
                          "recursive walk.\n  hint: keep your own stack (a list) of nodes still to visit.") from None
    require(len(order) == 40_001 and order[0] is x and order[-1] is y,
            f"on a chain of 20,000 multiplications the order should have 40,001 nodes from x to y; got {len(order)}.")
    return "4 random graphs and a 20,000-node chain"


# ---- 2. the executor --------------------------------------------------------------------------

def _value(node, feed, memo):
    """The oracle: a node's value by recursion over its inputs, each computed once (the checks'
    graphs are shallow)."""
    if node not in memo:
        kind = node.op.name
        memo[node] = (np.asarray(feed[node], dtype=np.float64) if kind == "placeholder" else
                      node.attrs["init"] if kind == "variable" else
                      node.op.compute(node, *[_value(i, feed, memo) for i in node.inputs]))
    return memo[node]


@exercise
def run_graph(your_run_graph):
    for _ in range(3):
        spy = _Spy()
        with G.Graph():
            xs, nodes, y, _, size = _random_dag()
            w = G.variable(rng().normal(size=(size,)), name="w")
            out = y * (w * w).sum()
            _unrelated = spy(nodes[2] + 1.0)  # in the graph, but not needed by `out`
            values = [rng().normal(size=(size,)) for _ in xs]
            feed = dict(zip(xs, values))
            yours = your_run_graph([out, nodes[4]], feed)
        require(spy.calls == 0, "your executor computed a node that the fetches do not need.",
                hint="evaluate only topological_order(fetches), not every node of the graph.")
        require(isinstance(yours, (list, tuple)) and len(yours) == 2,
                f"run_graph should return one value per fetch (a list of 2), got {fmt(yours)}.")
        memo = {}
        expected = [_value(f, feed, memo) for f in (out, nodes[4])]
        for k, (a, b) in enumerate(zip(yours, expected)):
            assert_close(a, b, what=f"the value of fetch {k}", rtol=1e-12, atol=1e-12,
                         hint="placeholders take their value from feed_dict, variables their `init`, "
                              "and every other node node.op.compute(node, *input_values).")
    return "3 random graphs with feeds, a variable and a node off the path"


# ---- 3-5. gradient rules as graph nodes ---------------------------------------------------

def _vjp(fn_torch, arrays, g):
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    out = fn_torch(*ts)
    return [t.numpy() for t in torch.autograd.grad(out, ts, grad_outputs=torch.tensor(g))]


def _negative(dim):
    return dim is not None and any(d < 0 for d in (dim if isinstance(dim, tuple) else (dim,)))


def _check_rule(rule, build, fn_torch, shapes, what, mistakes_of, hint=None):
    for sa, sb in shapes:
        with G.Graph():
            inputs = [G.placeholder(s, name=n) for s, n in zip((sa, sb), "ab") if s is not None]
            node = build(*inputs)
            g = G.placeholder(node.shape, name="g")
            try:
                grads = rule(node, g)
            except Exception as e:
                if hint is None:
                    raise
                raise CheckFailed(f"your rule raised {type(e).__name__}: {e}, for {what} with shape {sa}."
                                  f"\n  hint: {hint}") from e
        require(isinstance(grads, (list, tuple)) and len(grads) == len(inputs),
                f"a gradient rule returns a list with one gradient node per input ({len(inputs)}), got {fmt(grads)}.")
        values = [rng().normal(size=s) for s in (sa, sb) if s is not None]
        G_val = rng().normal(size=node.shape)
        feed = {**dict(zip(inputs, values)), g: G_val}
        expected = _vjp(fn_torch, values, G_val)
        for k, (gn, e) in enumerate(zip(grads, expected)):
            require(isinstance(gn, G.Node), f"the gradient for input {'ab'[k]} must be a graph node, got {fmt(gn)}.",
                    hint="a rule builds graph nodes with graph ops; it computes no numbers.")
            got = G.Session().run(gn, feed)
            assert_close(got, e, what=f"the gradient for {'ab'[k]} of {what} with shapes {sa} and {sb}",
                         rtol=1e-10, atol=1e-12, mistakes=mistakes_of(k, values, G_val), hint=hint)
    return f"{len(shapes)} shape cases against torch.autograd"


@exercise
def mul_gradient(your_mul_gradient):
    n, m = (int(v) for v in rng().choice([3, 5, 7], size=2, replace=False))
    shapes = [((n, m), (n, m)), ((n, m), (m,)), ((n, 1), (1, m)), ((), (n,))]

    def mistakes(k, values, g):
        a, b = values
        return {"swapped: each input's gradient is g times the OTHER input": g * (a if k == 0 else b),
                "each gradient must have its input's shape: where broadcasting stretched an input, "
                "its gradient is summed back": g * (b if k == 0 else a)}
    return _check_rule(your_mul_gradient, lambda a, b: a * b, torch.mul, shapes, "a * b", mistakes)


@exercise
def matmul_gradient(your_matmul_gradient):
    n, k, m = (int(v) for v in rng().choice([2, 3, 5, 7], size=3, replace=False))
    s = int(rng().choice([3, 5]))
    shapes = [((n, k), (k, m)), ((s, s), (s, s)), ((1, k), (k, n))]

    def mistakes(i, values, g):
        a, b = values
        return {"a's gradient needs b transposed": g @ b if g.shape[1] == b.shape[0] else None,
                "b's gradient needs a transposed": a @ g if a.shape[1] == g.shape[0] else None,
                "the order of the factors matters: a product's shape must be its input's": (b @ g.T if i == 0 else g.T @ a)
                if (b.shape[1] == g.shape[1] and i == 0) or (i == 1 and g.shape[0] == a.shape[0]) else None}
    return _check_rule(your_matmul_gradient, lambda a, b: a @ b, torch.matmul, shapes, "a @ b", mistakes)


@exercise
def sum_gradient(your_sum_gradient):
    n, m, p = (int(v) for v in rng().choice([2, 3, 5, 7], size=3, replace=False))
    # Random sizes, plus fixed traps drawn on every run: negative dims (-1 is the last), a negative dim
    # inside a tuple, and a dim that is not the last one.
    cases = [((n, m), 0, False), ((n, m), 1, True), ((n, m, p), (0, 2), False), ((n, m), None, False),
             ((n, m, p), 1, True), ((n, m, p), -1, False), ((n, m, p), (0, -1), False), ((n, m), -2, True),
             ((n, m, p), -2, False)]
    for shape, dim, keep in cases:
        _check_rule(lambda node, g: your_sum_gradient(node, g), lambda a: G.reduce_sum(a, dim, keep),
                    lambda a: a.sum(dim=dim, keepdim=keep) if dim is not None else a.sum(),
                    [(shape, None)], f"sum(a, dim={dim}, keepdim={keep})", lambda k, v, g: {},
                    hint="dim may be negative (-1 is the last dimension): turn it into a non-negative index "
                         "(d % ndim) before you compare it with positions." if _negative(dim) else None)
    return f"{len(cases)} reductions against torch.autograd, negative dims included"


# ---- 6. gradients() -------------------------------------------------------------------------

def _overwriting_gradients(y, xs):
    order = G.topological_order([y])
    adj = {y: ops.ones_like(y)}
    for node in reversed(order):
        if node in adj and node.inputs:
            for inp, gi in zip(node.inputs, node.op.gradient(node, adj[node])):
                if gi is not None:
                    adj[inp] = gi
    return [adj.get(x, ops.zeros_like(x)) for x in xs]


@exercise
def gradients(your_gradients):
    for _ in range(4):
        with G.Graph():
            xs, nodes, y, recipe, size = _random_dag(n_ops=14)
            yours = your_gradients(y, xs)
            wrong = _overwriting_gradients(y, xs)
        require(isinstance(yours, (list, tuple)) and len(yours) == len(xs),
                f"gradients(y, xs) returns one node per x ({len(xs)}), got {fmt(yours)}.")
        values = [rng().normal(size=(size,)) for _ in xs]
        feed = dict(zip(xs, values))
        ts, ty = _torch_eval(recipe, values)
        expected = torch.autograd.grad(ty, ts, allow_unused=True)
        wrong_vals = G.Session().run(wrong, feed)
        for k, (node, e) in enumerate(zip(yours, expected)):
            e = np.zeros(size) if e is None else e.numpy()
            assert_close(G.Session().run(node, feed), e, what=f"dy/dx{k}", rtol=1e-9, atol=1e-12,
                         mistakes={"a node used by several others gets the SUM of the gradients from every path: "
                                   "add to the adjoint when it already has one, do not overwrite it": wrong_vals[k]},
                         hint="go through topological_order([y]) in reverse, so a node's adjoint is complete before "
                              "you pass it on to its inputs.")
    return "4 random graphs with shared subexpressions, against torch.autograd"


# ---- 7-8. passes ----------------------------------------------------------------------------

def _pass_graph():
    """A graph with foldable constants, duplicate expressions, a placeholder and a variable."""
    size = int(rng().choice([3, 5, 7]))
    x = G.placeholder((size,), name="x")
    v = G.variable(rng().normal(size=(size,)), name="v")
    c1, c2 = G.constant(rng().normal(size=(size,))), G.constant(float(rng().uniform(1, 2)))
    k = (c1 * c2 + G.constant(1.5)).exp()           # foldable
    a = (x * v + k).sigmoid()
    b = (x * v + k).sigmoid()                        # duplicate of a
    m = G.reduce_sum(G.reshape(x, (1, size)) * G.constant(np.ones((2, 1)) * 0.5), 0)
    n = G.reduce_sum(G.reshape(x, (1, size)) * G.constant(np.ones((2, 1)) * 0.5), 1)
    d1, d2 = v - x, x - v                            # same inputs, different order: not equal
    y = (a * b + d1 * d2).sum() + (m * m).sum() * (n * n).sum() + (v * (G.constant(2.0) * G.constant(3.0))).sum()
    return {x: (size,)}, [v], y, [G.assign(v, v + 0.5)]


def _trap_graph():
    """Fixed traps, on every run: constants on the LEFT of ops that read a placeholder or a variable,
    two placeholders of one shape, two variables with the same initial value (only one of them will
    change), and a matmul next to the same matmul with its inputs swapped (a @ b is not b @ a)."""
    s = int(rng().choice([3, 4, 5]))
    x1, x2 = G.placeholder((s, s), name="x1"), G.placeholder((s, s), name="x2")
    init = rng().normal(size=(s, s))
    v1, v2 = G.variable(init, name="v1"), G.variable(init.copy(), name="v2")
    c = G.constant(rng().normal(size=(s, s)))
    k = G.constant(float(rng().uniform(1, 2))) * c   # foldable, constant on the left
    left = (k * x1 - G.constant(0.5) * v2).sum()     # constants on the left of a placeholder, a variable
    swapped = ((x1 @ v1) * (v1 @ x1)).sum()          # matmul: not commutative
    twins = ((x1 - x2) * (v1 - v2 + 1.0)).sum()      # merging x1 with x2, or v1 with v2, changes this
    dup = ((x2 * v1) * (v1 * x2)).sum()              # mul IS commutative: these two merge
    y = left + swapped + twins + dup
    return {x1: (s, s), x2: (s, s)}, [v1, v2], y, [G.assign(v1, v1 + 0.5)]


def _readers(outputs, leaf):
    """How many nodes of the graph depend on leaf (leaf included)."""
    depends = set()
    for n in G.topological_order(outputs):
        if n is leaf or any(i in depends for i in n.inputs):
            depends.add(n)
    return len(depends)


def _folded_count(y):
    """The oracle of constant folding, counted: the nodes that read a placeholder or a variable stay,
    and each input of theirs that reads neither becomes one constant (the whole output, if nothing does)."""
    live = set()
    for n in G.topological_order([y]):
        if n.op.name in ("placeholder", "variable") or any(i in live for i in n.inputs):
            live.add(n)
    if y not in live:
        return 1
    return len(live) + len({i for n in live for i in n.inputs if i not in live})


def _distinct_count(y):
    """The oracle of common-subexpression elimination, counted: the number of distinct computations, each
    node named by its op, the names of its inputs (in any order for add and mul) and its attributes;
    placeholders and variables are each their own."""
    name_of = {}
    for n in G.topological_order([y]):
        op = n.op.name
        if op in ("placeholder", "variable", "assign"):
            key = (op, id(n))
        elif op == "constant":
            key = (op, str(n.attrs["value"].dtype), n.attrs["value"].shape, n.attrs["value"].tobytes())
        else:
            inputs = tuple(name_of[i] for i in n.inputs)
            key = (op, tuple(sorted(inputs)) if op in ("add", "mul") else inputs,
                   tuple(sorted((k, repr(v)) for k, v in n.attrs.items())))
        name_of[n] = key
    return len(set(name_of.values()))


def _check_pass(your_pass, expected_count, name, hint, folding=False):
    for build in (_trap_graph, _pass_graph, _pass_graph, _pass_graph):
        with G.Graph():
            shapes, variables, y, bumps = build()
        leaves = list(shapes) + variables
        what_leaves = ", ".join(f"{leaf.op.name} {leaf.name}" for leaf in leaves)
        before = G.count_nodes([y])
        try:
            new = your_pass([y])
        except Exception as e:
            raise CheckFailed(f"{name} raised {type(e).__name__}: {e}, on a graph whose output reads "
                              f"{what_leaves}.\n  hint: {hint}") from e
        require(isinstance(new, (list, tuple)) and len(new) == 1 and isinstance(new[0], G.Node),
                f"{name} should return a list with one new output node per output, got {fmt(new)}.")
        diagnosis = hint
        for leaf in leaves:
            fate = "replaced by constants" if folding else "merged into nodes that read something else"
            require(leaf in G.topological_order(new), f"the optimized graph no longer reads {leaf.op.name} {leaf.name}: "
                    f"the nodes that depend on it were {fate}, so later runs would ignore its own value.", hint=hint)
            if folding and _readers(new, leaf) < _readers([y], leaf):
                diagnosis = (f"your pass turned nodes that depend on {leaf.op.name} {leaf.name} into constants, "
                             f"but its value changes from run to run: fold only when ALL inputs are constants "
                             f"(a constant may be on either side).")
        sess_a, sess_b = G.Session(), G.Session()
        for step in range(2):
            feed = {p: rng().normal(size=shape) for p, shape in shapes.items()}
            assert_close(sess_b.run(new[0], feed), sess_a.run(y, feed),
                         what=f"the optimized graph's output (run {step + 1}"
                              f"{', after a variable changed' if step else ''}), on a graph reading {what_leaves}",
                         rtol=1e-12, atol=1e-12, hint=diagnosis)
            sess_a.run(bumps)
            sess_b.run(bumps)
        expected = expected_count(y)
        got = G.count_nodes(new)
        require(got <= expected, f"{name} left {got} nodes; it can get the graph from {before} down to {expected}.")
    return "a fixed graph of traps and 3 random graphs, re-run after a variable changed"


@exercise
def fold_constants(your_fold_constants):
    return _check_pass(your_fold_constants, _folded_count, "constant folding",
                       "fold a node only when ALL its inputs are constants: a node that reads a placeholder "
                       "or a variable must stay, since its value changes from run to run.", folding=True)


@exercise
def eliminate_common_subexpressions(your_eliminate_common_subexpressions):
    return _check_pass(your_eliminate_common_subexpressions, _distinct_count, "CSE",
                       "two nodes are the same only with the same op, the same inputs in the same order "
                       "(except for add and mul: a @ b is not b @ a), and the same attributes (sum over dim 0 is "
                       "not sum over dim 1). Placeholders and variables are never merged, even when they look "
                       "alike: each has its own value.")


# ---- 9. training ----------------------------------------------------------------------------

def _softmax_regression_losses(X, Y, W, b, lr, steps):
    """The oracle: softmax regression by hand in numpy, full batch."""
    losses = []
    for _ in range(steps):
        z = X @ W + b
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        losses.append(-np.sum(Y * np.log(p)) / len(X))
        gz = (p - Y) / len(X)
        W, b = W - lr * X.T @ gz, b - lr * gz.sum(axis=0)
    return np.array(losses), W, b


@exercise
def training_loop(your_train):
    n, d, c = int(rng().integers(20, 40)), int(rng().choice([3, 5])), int(rng().choice([3, 4]))
    X, Y = rng().normal(size=(n, d)), np.eye(c)[rng().integers(0, c, n)]
    W0, b0, lr, steps = rng().normal(size=(d, c)) * 0.3, rng().normal(size=(c,)) * 0.1, 0.5, 15
    with G.Graph():
        x, y = G.placeholder((None, d), name="x"), G.placeholder((None, c), name="y")
        W, b = G.variable(W0, name="W"), G.variable(b0, name="b")
        loss = G.softmax_cross_entropy(x @ W + b, y)
        train_ops = G.sgd_step(loss, [W, b], lr)
    sess = G.Session()
    losses = your_train(sess, loss, train_ops, {x: X, y: Y}, steps)
    expected, We, be = _softmax_regression_losses(X, Y, W0, b0, lr, steps)
    late = _softmax_regression_losses(X, Y, W0, b0, lr, steps + 1)[0][1:]
    require(losses is not None and len(losses) == steps, f"train should return {steps} losses, got {fmt(losses)}.")
    assert_close(losses, expected, what="the losses", rtol=1e-9, atol=1e-12,
                 mistakes={"your losses are one step late: the loss and the update must come from the same run, "
                           "so that the loss is measured before the update": late,
                           "the loss never changes: run train_ops every step, in the same Session":
                           np.full(steps, expected[0])})
    assert_close(sess.value_of(W), We, what="W after training", rtol=1e-9, atol=1e-12)
    return f"{steps} steps of softmax regression against a numpy oracle"
