"""Checks for chapter 01, the scalar autograd engine: each op, the topological sort,
backward(), a neuron, an MLP's parameters and one training step, all against PyTorch float64.
Each op's rule is also put through chapter 00's gradient check: the learner's backward against
nudging the learner's own forward."""

import contextlib

import numpy as np
import torch

from course_lib.autograd import MLP, Neuron, Value, engine, value
from course_lib.autograd.losses import svm_loss  # noqa: F401  (work saved before it moved imports it from here)
from course_lib.checks import CheckFailed, assert_close, exercise, fmt, require, rng
from course_lib.gradcheck import gradient_check

CASES = 12


@contextlib.contextmanager
def _rule(op, fn):
    """Use `fn` as the backward rule of `op` while the block runs."""
    saved = value.RULES[op]
    value.RULES[op] = fn
    try:
        yield
    finally:
        value.RULES[op] = saved


def _adopt(forward):
    """The learner's forward, its result made a node of the engine's class with the same record, so
    that the check's expressions can go on with the engine's other ops."""
    def run(*args):
        node = forward(*args)
        if isinstance(node, value.Value) and not isinstance(node, Value):
            node = Value(node.data, node._prev, node._op, node._arg)
        return node
    return run


def _leaves(values):
    return [Value(float(v), label=name) for v, name in zip(values, "abc")]


def _run(expr, op, values, rule):
    """Build expr on leaves a, b, c, backprop with `rule` as op's rule; returns [out, da, db, dc]."""
    xs = _leaves(values)
    with _rule(op, rule):
        out = expr(*xs)
        out.backward()
    return [out.data] + [x.grad for x in xs]


def _torch(expr, values):
    ts = [torch.tensor(float(v), dtype=torch.float64, requires_grad=True) for v in values]
    out = expr(*ts)
    out.backward()
    return [out.item()] + [t.grad.item() for t in ts]


def _gradient_check(expr, op, values, rule):
    """Chapter 00's gradient check: the grads of expr by backprop (with `rule` as op's rule)
    against the central differences of expr's forward values."""
    def f(x):
        return float(expr(*_leaves(x)).data)

    def grad_f(x):
        return np.array(_run(expr, op, x, rule)[1:], dtype=np.float64)
    return gradient_check(f, grad_f, np.asarray(values, dtype=np.float64))


def _check_op(op, forward, backward, expr_for, low, high, wrong_rules, n=CASES):
    """Random expressions that use the learner's op (some inputs twice, one node as both inputs
    of a binary op) against PyTorch, then through chapter 00's gradient check."""
    probe = forward(*[Value(0.7)] * (2 if op in ("+", "*") else 1))
    require(isinstance(probe, value.Value), f"your forward returned {fmt(probe)}, not a Value.",
            hint="the forward makes a new node, a Value that records its inputs and its op's name.")
    require(probe._op == op, f"your forward made a node with op {probe._op!r}; expected {op!r}.",
            hint="backward() finds a node's rule by the op name the node records.")
    for case in range(n):
        values = rng().uniform(low, high, size=3)
        ours, theirs = expr_for(case)
        yours = _run(ours, op, values, backward)
        expected = _torch(theirs, values)
        mistakes = {hint: _run(ours, op, values, fn) for hint, fn in wrong_rules.items()}
        assert_close(yours, expected, what=f"[output, d/da, d/db, d/dc] of a random expression using {op}",
                     inputs={"a, b, c": values}, rtol=1e-9, atol=1e-12, mistakes=mistakes,
                     hint="the forward value is element 0; the grads follow. Check the local derivative "
                          "and that you add (+=) into each child's grad.")
        error = _gradient_check(ours, op, values, backward)
        require(error < 1e-4, f"chapter 00's gradient check on a random expression using {op} (a, b, c = "
                f"{fmt(values)}): the worst relative error between your grads and the numerical ones is "
                f"{fmt(error)}, expected below 1e-4.",
                hint="your backward rule does not match your forward: check the local derivative.")
    return f"{n} random expressions, against PyTorch float64 and chapter 00's gradient check"


# ---- expressions, each written once for Values and tensors alike -------------------------

def _binary(f):
    def expr(a, b, c):
        u = f(a, b)
        v = f(u, a)  # a is used twice
        w = f(v.tanh(), c)
        s = f(c, c)  # one node as both inputs: c + c, c * c
        return f(w, u) * 0.7 + w.tanh() + s * 0.3  # u and w are used twice
    return expr


def _unary(f):
    def expr(a, b, c):
        u = f(a * b + c)
        v = u * c + f(u) * a  # u is used twice, once by the op itself
        w = f(v) + f(v * b)
        return w * 0.5 + f(a) * (v + f(a))  # f(a) twice, and a feeds the op and a product
    return expr


@exercise
def mul(your_mul, your_mul_backward):
    """out = a * b: forward and backward."""
    def assign(out):
        a, b = out._prev
        a.grad = b.data * out.grad
        b.grad = a.data * out.grad

    def own(out):
        a, b = out._prev
        a.grad += a.data * out.grad
        b.grad += b.data * out.grad
    wrong = {"a node used twice loses one of its gradients: use += (accumulate), not =": assign,
             "d(a*b)/da is b, not a: each input's grad uses the OTHER input's data": own}
    exprs = lambda case: (_binary(_adopt(your_mul)), _binary(lambda x, y: x * y))
    return _check_op("*", your_mul, your_mul_backward, exprs, -1.5, 1.5, wrong)


@exercise
def exp(your_exp, your_exp_backward):
    """out = exp(a): forward and backward."""
    def from_input(out):
        (a,) = out._prev
        a.grad += a.data * out.grad

    def no_chain(out):
        (a,) = out._prev
        a.grad += out.data

    def assign(out):
        (a,) = out._prev
        a.grad = out.data * out.grad
    wrong = {"d exp(a)/da = exp(a), which is the OUTPUT out.data, not the input a.data": from_input,
             "multiply by out.grad: the chain rule carries the gradient from the output": no_chain,
             "a node used twice loses one of its gradients: use += (accumulate), not =": assign}
    # inputs in [-0.5, 0.5] keep the nested exponentials of the expression below about 200
    return _check_op("exp", your_exp, your_exp_backward, lambda case: (_unary(_adopt(your_exp)), _unary(torch.exp)),
                     -0.5, 0.5, wrong)


@exercise
def power(your_power, your_pow_backward):
    """out = a ** k for an int or float constant k (stored in out._arg)."""
    exponents = [2, 3, -1, 1.5, -0.5]

    def exprs(case):
        k = exponents[case % len(exponents)]
        return _unary(_adopt(lambda x: your_power(x, k))), _unary(lambda x: x**k)

    def off_by_one(out):
        (a,), k = out._prev, out._arg
        a.grad += k * a.data**k * out.grad

    def no_k(out):
        (a,), k = out._prev, out._arg
        a.grad += a.data ** (k - 1) * out.grad

    def assign(out):
        (a,), k = out._prev, out._arg
        a.grad = k * a.data ** (k - 1) * out.grad
    wrong = {"the exponent is off by one: d(a**k)/da = k * a**(k-1)": off_by_one,
             "you dropped the factor k: d(a**k)/da = k * a**(k-1)": no_k,
             "a node used twice loses one of its gradients: use += (accumulate), not =": assign}
    probe = your_power(Value(1.3), 3)
    require(isinstance(probe, value.Value) and probe._arg == 3,
            f"power(Value(1.3), 3) should keep the exponent in out._arg; it holds {fmt(getattr(probe, '_arg', None))}.",
            hint="the rule reads the exponent from the node's record, so the forward must store it there.")
    return _check_op("**", lambda x: your_power(x, 2), your_pow_backward, exprs, 0.4, 1.6, wrong, n=10)


@exercise
def tanh(your_tanh, your_tanh_backward):
    """out = tanh(a): forward and backward."""
    def from_input(out):
        (a,) = out._prev
        a.grad += (1 - a.data**2) * out.grad

    def no_square(out):
        (a,) = out._prev
        a.grad += (1 - out.data) * out.grad

    def assign(out):
        (a,) = out._prev
        a.grad = (1 - out.data**2) * out.grad
    wrong = {"d tanh(a)/da = 1 - tanh(a)**2: square the OUTPUT out.data, not the input": from_input,
             "square it: d tanh(a)/da = 1 - tanh(a)**2": no_square,
             "a node used twice loses one of its gradients: use += (accumulate), not =": assign}
    exprs = lambda case: (_unary(_adopt(your_tanh)), _unary(torch.tanh))
    return _check_op("tanh", your_tanh, your_tanh_backward, exprs, -1.5, 1.5, wrong)


@exercise
def relu(your_relu, your_relu_backward):
    """out = relu(a) = max(a, 0): forward and backward."""
    def always(out):
        (a,) = out._prev
        a.grad += out.grad

    def assign(out):
        (a,) = out._prev
        a.grad = (out.data > 0) * out.grad
    wrong = {"the gradient flows only where the input was positive; elsewhere relu is flat": always,
             "a node used twice loses one of its gradients: use += (accumulate), not =": assign}
    exprs = lambda case: (_unary(_adopt(your_relu)), _unary(torch.relu))
    return _check_op("relu", your_relu, your_relu_backward, exprs, -1.5, 1.5, wrong)


# ---- topological order and backward ------------------------------------------------------

def _random_graph(n_leaves, n_ops):
    """A random expression DAG with shared subexpressions; returns (root, leaves)."""
    leaves = [Value(float(v), label=f"x{i}") for i, v in enumerate(rng().uniform(-1.2, 1.2, size=n_leaves))]
    nodes = list(leaves)
    for _ in range(n_ops):
        i, j = (int(t) for t in rng().integers(0, len(nodes), size=2))
        a, b = nodes[i], nodes[j]
        kind = int(rng().integers(0, 4))
        nodes.append(a + b if kind == 0 else a * b if kind == 1 else (a * 0.8).tanh() if kind == 2 else a - b * 0.5)
    root = nodes[-1]
    for v in nodes[:-1]:  # make sure every node feeds the root
        root = root + v * 0.1
    return root, leaves


def _reachable(root):
    seen, stack = {id(root): root}, [root]
    while stack:
        for c in stack.pop()._prev:
            if id(c) not in seen:
                seen[id(c)] = c
                stack.append(c)
    return seen


def _check_order(order, root, what):
    require(isinstance(order, list), f"{what}: expected a list of Values, got {type(order).__name__}.",
            hint="return the list you appended the nodes to.")
    ids = [id(v) for v in order]
    reach = _reachable(root)
    require(len(ids) == len(set(ids)),
            f"{what}: {len(ids) - len(set(ids))} node(s) appear more than once in your order "
            f"(length {len(ids)}, the graph has {len(reach)} nodes).",
            hint="remember the nodes you have visited (a set) and skip them.")
    require(set(ids) == set(reach), f"{what}: your order has {len(set(ids) & set(reach))} of the graph's "
            f"{len(reach)} nodes"
            + (f" and {len(set(ids) - set(reach))} that are not in it" if set(ids) - set(reach) else "") + ".",
            hint="every node under the root, the root and the leaves included, must appear.")
    pos = {i: k for k, i in enumerate(ids)}
    for v in order:
        for c in v._prev:
            if pos[id(c)] > pos[id(v)]:
                rev = pos[id(root)] == 0
                raise CheckFailed(
                    f"{what}: node {v!r} (op {v._op!r}, position {pos[id(v)]}) comes before its child "
                    f"{c!r} (position {pos[id(c)]}).\n  hint: " +
                    ("your order is reversed: the root must come LAST (children first); backward() walks it reversed."
                     if rev else "append a node only after all of its children have been appended."))


@exercise
def topological_order(your_topological_order):
    """Every node of the graph once, each after its children; must work 5,000 deep."""
    for n_ops in (1, 7, 23, 40):
        root, _ = _random_graph(int(rng().integers(2, 6)), n_ops)
        _check_order(your_topological_order(root), root, f"a random graph with {len(_reachable(root))} nodes")
    x = Value(float(rng().uniform(0.5, 1.5)))
    y = x
    for _ in range(5000):
        y = y * 1.0001
    try:
        order = your_topological_order(y)
    except RecursionError:
        raise CheckFailed("a chain 5,000 nodes deep raised RecursionError.\n  hint: replace the recursion "
                          "with a loop over an explicit stack (a Python list).") from None
    _check_order(order, y, "a chain 5,000 nodes deep")
    return "4 random graphs and a chain 5,000 deep"


def _torch_graph_grads(root, leaves):
    """The gradient of root w.r.t. each leaf, by replaying the Value graph in torch float64."""
    t = {}
    for v in engine.topological_order(root):
        if not v._op:
            t[id(v)] = torch.tensor(float(v.data), dtype=torch.float64, requires_grad=v in leaves)
            continue
        xs = [t[id(c)] for c in v._prev]
        t[id(v)] = {"+": lambda: xs[0] + xs[1], "*": lambda: xs[0] * xs[1], "tanh": lambda: xs[0].tanh(),
                    "**": lambda: xs[0] ** v._arg, "relu": lambda: xs[0].relu()}[v._op]()
    leaf_t = [t[id(v)] for v in leaves]
    grads = torch.autograd.grad(t[id(root)], leaf_t)
    return np.array([g.item() for g in grads])


def _leaf_grads_without_reset(root, order, stale, leaves):
    """The leaves' grads that a backward() without the reset would give, starting from `stale`."""
    for v, g in zip(order, stale):
        v.grad = g
    root.grad = 1
    for v in reversed(order):
        v._backward()
    return np.array([x.grad for x in leaves])


@exercise
def backward(your_backward):
    """backward(root): every grad of the graph, d(root)/d(node); calling it twice gives the same grads."""
    for n_ops in (5, 17, 31):
        root, leaves = _random_graph(int(rng().integers(3, 7)), n_ops)
        expected = _torch_graph_grads(root, leaves)
        order = engine.topological_order(root)
        stale = [float(g) for g in rng().uniform(-1, 1, size=len(order))]  # grads left by an earlier run
        no_reset = _leaf_grads_without_reset(root, order, stale, leaves)
        for v, g in zip(order, stale):
            v.grad = g
        your_backward(root)
        first = np.array([x.grad for x in leaves])
        assert_close(first, expected, what=f"the leaves' grads after backward() on a random graph of {len(order)} nodes",
                     rtol=1e-9, atol=1e-12,
                     hint="a node's rule may run only once its grad is complete, after the rules of every node "
                          "that uses it, and every grad of the graph starts from nothing.",
                     mistakes={"the grads left by an earlier run were added to: every grad of the graph, not only "
                               "the leaves', must start from nothing": no_reset})
        require(root.grad == 1, f"after backward(), root.grad should be 1; it is {fmt(root.grad)}.")
        your_backward(root)
        second = np.array([x.grad for x in leaves])
        assert_close(second, first, what="the leaves' grads after calling backward() a second time",
                     rtol=1e-12, atol=1e-12,
                     mistakes={"the grads accumulated across the two calls: each call must start every grad of the "
                               "graph from nothing, so that re-running gives the same answer": 2 * first},
                     hint="the second call must start from zeroed grads, just like the first.")
    return "3 random graphs against PyTorch, each backpropagated twice"


# ---- neurons, MLPs and training ----------------------------------------------------------

@exercise
def neuron_call(your_neuron_call):
    """neuron_call(neuron, x) = relu(w . x + b), or w . x + b when neuron.nonlin is False."""
    for case in range(8):
        nin = int(rng().integers(1, 8))
        nonlin = case % 2 == 0
        n = Neuron(nin, nonlin=nonlin)
        for w in n.w:
            w.data = float(rng().uniform(-1, 1))
        n.b.data = float(rng().uniform(-0.5, 0.5))
        xs = rng().uniform(-1.5, 1.5, size=nin)
        if not nonlin:  # a negative pre-activation, so that a stray relu shows
            n.b.data = -float(sum(w.data * v for w, v in zip(n.w, xs))) - float(rng().uniform(0.1, 0.6))
        x = [Value(float(v)) for v in xs]
        out = your_neuron_call(n, x)
        require(isinstance(out, Value), f"neuron_call returned {fmt(out)}; expected a Value.",
                hint="build the sum with Value operations so that it can be backpropagated.")
        out.backward()
        w_t = torch.tensor([w.data for w in n.w], dtype=torch.float64, requires_grad=True)
        b_t = torch.tensor(n.b.data, dtype=torch.float64, requires_grad=True)
        x_t = torch.tensor(xs, dtype=torch.float64, requires_grad=True)
        act = w_t @ x_t + b_t
        (act.relu() if nonlin else act).backward()
        expected_out = act.relu().item() if nonlin else act.item()
        wx = float(w_t.detach() @ x_t.detach())
        yours = [out.data] + [w.grad for w in n.w] + [n.b.grad] + [v.grad for v in x]
        expected = [expected_out] + w_t.grad.tolist() + [b_t.grad.item()] + x_t.grad.tolist()
        assert_close(yours[0], expected[0], what=f"the output of a {'relu' if nonlin else 'linear'} neuron with {nin} inputs",
                     inputs={"w": np.array([w.data for w in n.w]), "b": n.b.data, "x": xs}, rtol=1e-9, atol=1e-12,
                     mistakes={"you forgot the bias b": max(wx, 0) if nonlin else wx,
                               "apply relu only when neuron.nonlin is True": max(act.item(), 0),
                               "apply relu when neuron.nonlin is True": act.item()})
        assert_close(yours[1:], expected[1:], what="the grads of [w..., b, x...] after backward()",
                     rtol=1e-9, atol=1e-12, hint="use Value operations (* and +) only, so the graph records them.")
    return "8 random neurons, relu and linear, values and grads against PyTorch"


@exercise
def mlp_parameters(your_mlp_parameters):
    """mlp_parameters(mlp): every weight and bias, layer by layer, neuron by neuron, w before b."""
    for _ in range(3):
        sizes = [int(s) for s in rng().integers(1, 6, size=int(rng().integers(2, 4)))]
        nin = int(rng().integers(1, 5))
        m = MLP(nin, sizes)
        yours = your_mlp_parameters(m)
        require(isinstance(yours, list), f"expected a flat list, got {type(yours).__name__}.")
        require(all(isinstance(p, Value) for p in yours),
                "expected a flat list of Values; found "
                f"{fmt([type(p).__name__ for p in yours if not isinstance(p, Value)][:3])}.",
                hint="one flat list of Values, not a list per layer or per neuron.")
        torch_net = torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in zip([nin] + sizes, sizes)])
        count = sum(p.numel() for p in torch_net.parameters())
        n_w = sum(a * b for a, b in zip([nin] + sizes, sizes))
        if len(yours) != count:
            hint = ("the biases are missing" if len(yours) == n_w else
                    "only the first layer's parameters?" if len(yours) == (nin + 1) * sizes[0] else
                    "a parameter is listed twice" if len(yours) > count else None)
            raise CheckFailed(f"an MLP({nin}, {sizes}) has {count} parameters (as a torch Sequential of Linear "
                              f"layers); your list has {len(yours)}." + (f"\n  hint: {hint}" if hint else ""))
        expected = []
        for layer in m.layers:  # micrograd's order
            for neuron in layer.neurons:
                expected.extend(neuron.w)
                expected.append(neuron.b)
        bad = next((i for i, (p, q) in enumerate(zip(yours, expected)) if p is not q), None)
        if bad is not None:
            raise CheckFailed(f"MLP({nin}, {sizes}): parameter {bad} of your list is not the expected one "
                              f"(yours {yours[bad]!r}, expected {expected[bad]!r}).\n  hint: go layer by layer, "
                              f"neuron by neuron, each neuron's weights w then its bias b, as micrograd does.")
    return "3 random MLP shapes"


def _points(n):
    """n random points in the plane, labelled +1 above a parabola and -1 below."""
    x = rng().uniform(-1.5, 1.5, size=(n, 2))
    y = np.where(x[:, 1] > 0.3 * x[:, 0] ** 2 - 0.2, 1, -1)
    return x, y


def _torch_steps(params, sizes, X, y, lr, steps):
    """The same training steps as the exercise, in PyTorch float64; returns the losses and final params."""
    ps = [torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in params]
    losses = []
    for _ in range(steps):
        h = [torch.tensor(row, dtype=torch.float64) for row in X]
        outs = []
        for row in h:
            i, a = 0, row
            for k, (nin, nout) in enumerate(zip([2] + sizes, sizes)):
                nxt = []
                for _ in range(nout):
                    w, b = torch.stack(ps[i:i + nin]), ps[i + nin]
                    i += nin + 1
                    z = w @ a + b
                    nxt.append(z.relu() if k < len(sizes) - 1 else z)
                a = torch.stack(nxt)
            outs.append(a[0])
        loss = sum((1 - yi * s).relu() for yi, s in zip(y.tolist(), outs)) / len(outs)
        for p in ps:
            p.grad = None
        loss.backward()
        with torch.no_grad():
            for p in ps:
                p -= lr * p.grad
        losses.append(loss.item())
    return losses, [p.item() for p in ps]


@exercise
def sgd_step(your_sgd_step):
    """sgd_step(model, X, y, lr): zero the grads, compute the loss, backprop, step; returns the loss Value."""
    import random

    from micrograd import nn as mg_nn

    sizes = [5, 3, 1]
    X, y = _points(int(rng().integers(9, 16)))
    lr = float(rng().uniform(0.05, 0.2))
    random.seed(int(rng().integers(1 << 30)))
    models = [("the course engine", MLP(2, sizes)), ("micrograd's engine, where grads accumulate", mg_nn.MLP(2, sizes))]
    for name, model in models:
        params = [float(rng().uniform(-1, 1)) for _ in model.parameters()]
        for p, v in zip(model.parameters(), params):
            p.data, p.grad = v, float(rng().uniform(-1, 1))  # stale grads, as after an earlier step
        exp_losses, exp_params = _torch_steps(params, sizes, X, y, lr, 2)
        losses = []
        for _ in range(2):
            loss = your_sgd_step(model, X, y, lr)
            require(hasattr(loss, "data"), f"sgd_step should return the loss Value; it returned {fmt(loss)}.")
            losses.append(loss.data)
        assert_close(losses, exp_losses, what=f"the losses of two steps on {name}", rtol=1e-9, atol=1e-12,
                     mistakes={"the loss did not change between the steps: the parameters never moved": [exp_losses[0]] * 2},
                     hint=("on micrograd backward() adds into whatever the grads hold: a step must not see the "
                           "grads of the one before" if "micrograd" in name
                           else "each step moves the parameters with the gradient of that step's own loss, once the "
                                "backward pass is complete."))
        yours = [p.data for p in model.parameters()]
        wrong_sign = [2 * a - b for a, b in zip(params, exp_params)]
        assert_close(yours, exp_params, what=f"the parameters after two steps on {name}", rtol=1e-9, atol=1e-12,
                     mistakes={"the parameters moved up the gradient: descent steps against it": wrong_sign},
                     hint=("on micrograd backward() adds into whatever the grads hold: a step must not see the "
                           "grads of the one before" if "micrograd" in name
                           else "every parameter the model lists moves against its own gradient, scaled by lr."))
    return "2 steps on the course engine and on micrograd's, against PyTorch float64"
