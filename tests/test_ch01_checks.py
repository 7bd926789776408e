"""Chapter 01's checks pass on the reference and reject plausible mistakes."""

import math

import pytest
from checking import expect_failure, expect_pass

from course_lib.autograd.losses import svm_loss
from course_lib.autograd.value import Value
from course_lib.checks import ch01 as check

# ---- reference answers -------------------------------------------------------------------

def mul(a, b):
    return Value(a.data * b.data, (a, b), "*")


def mul_backward(out):
    a, b = out._prev
    a.grad += b.data * out.grad
    b.grad += a.data * out.grad


def exp(a):
    return Value(math.exp(a.data), (a,), "exp")


def exp_backward(out):
    (a,) = out._prev
    a.grad += out.data * out.grad


def power(a, k):
    return Value(a.data**k, (a,), "**", k)


def pow_backward(out):
    (a,), k = out._prev, out._arg
    a.grad += k * a.data ** (k - 1) * out.grad


def tanh(a):
    return Value(math.tanh(a.data), (a,), "tanh")


def tanh_backward(out):
    (a,) = out._prev
    a.grad += (1 - out.data**2) * out.grad


def relu(a):
    return Value(max(a.data, 0.0), (a,), "relu")


def relu_backward(out):
    (a,) = out._prev
    a.grad += (out.data > 0) * out.grad


def topological_order(root):
    order, seen, done, stack = [], set(), set(), [root]
    while stack:
        v = stack[-1]
        if v not in seen:
            seen.add(v)
            stack.extend(c for c in v._prev if c not in seen)
        else:
            stack.pop()
            if v not in done:
                done.add(v)
                order.append(v)
    return order


def backward(root):
    topo = topological_order(root)
    for v in topo:
        v.grad = 0
    root.grad = 1
    for v in reversed(topo):
        v._backward()


def neuron_call(neuron, x):
    act = neuron.b
    for wi, xi in zip(neuron.w, x):
        act = act + wi * xi
    return act.relu() if neuron.nonlin else act


def mlp_parameters(mlp):
    return [p for layer in mlp.layers for n in layer.neurons for p in n.w + [n.b]]


def sgd_step(model, X, y, lr):
    model.zero_grad()
    loss = svm_loss(model, X, y)
    loss.backward()
    for p in model.parameters():
        p.data -= lr * p.grad
    return loss


def test_reference_passes(capsys):
    check.mul(mul, mul_backward)
    check.exp(exp, exp_backward)
    check.power(power, pow_backward)
    check.tanh(tanh, tanh_backward)
    check.relu(relu, relu_backward)
    check.topological_order(topological_order)
    check.backward(backward)
    check.neuron_call(neuron_call)
    check.mlp_parameters(mlp_parameters)
    check.sgd_step(sgd_step)
    assert capsys.readouterr().out.count("passed") == 10


def test_untouched_stubs_fail():
    def stub(*args):
        raise NotImplementedError
    for name, n in [("mul", 2), ("exp", 2), ("power", 2), ("tanh", 2), ("relu", 2), ("topological_order", 1),
                    ("backward", 1), ("neuron_call", 1), ("mlp_parameters", 1), ("sgd_step", 1)]:
        expect_failure(getattr(check, name), *[stub] * n, match="not implemented")


# ---- wrong implementations ---------------------------------------------------------------

def mul_own(out):
    a, b = out._prev
    a.grad += a.data * out.grad
    b.grad += b.data * out.grad


def mul_assign(out):
    a, b = out._prev
    a.grad = b.data * out.grad
    b.grad = a.data * out.grad


def mul_set_children(a, b):  # micrograd keeps its children in a set: x * x then has one child
    return Value(a.data * b.data, tuple({a: None, b: None}), "*")


def mul_no_chain(out):
    a, b = out._prev
    a.grad += b.data
    b.grad += a.data


@pytest.mark.parametrize("fwd, bwd, match", [
    (mul, mul_own, "OTHER input"),
    (mul, mul_assign, "+="),
    (mul_set_children, mul_backward, "raised ValueError"),
    (mul, mul_no_chain, "differs"),
    (lambda a, b: Value(a.data * b.data, (a, b), "mul"), mul_backward, "op name"),
])
def test_mul_rejects(fwd, bwd, match):
    expect_failure(check.mul, fwd, bwd, match=match)


def exp_from_input(out):
    (a,) = out._prev
    a.grad += a.data * out.grad


def exp_no_chain(out):
    (a,) = out._prev
    a.grad += out.data


def exp_assign(out):
    (a,) = out._prev
    a.grad = out.data * out.grad


@pytest.mark.parametrize("fwd, bwd, match", [
    (exp, exp_from_input, "OUTPUT"),
    (exp, exp_no_chain, "out.grad"),
    (exp, exp_assign, "+="),
    (lambda a: Value(math.exp(a.data), (a,), "exp"), lambda out: None, "differs"),
    (lambda a: Value(math.e * a.data, (a,), "exp"), exp_backward, "differs"),
])
def test_exp_rejects(fwd, bwd, match):
    expect_failure(check.exp, fwd, bwd, match=match)


def test_rules_go_through_chapter_00s_gradient_check():
    """A rule that matches PyTorch only because the forward is wrong in the same way would still be
    caught; here the oracle itself: the course's gradient check flags a wrong rule on its own."""
    expr = check._binary(check._adopt(mul))
    good = check._gradient_check(expr, "*", [0.3, -0.7, 1.1], mul_backward)
    bad = check._gradient_check(expr, "*", [0.3, -0.7, 1.1], mul_own)
    assert good < 1e-6 < 1e-2 < bad


def pow_off_by_one(out):
    (a,), k = out._prev, out._arg
    a.grad += k * a.data**k * out.grad


def pow_no_k(out):
    (a,), k = out._prev, out._arg
    a.grad += a.data ** (k - 1) * out.grad


@pytest.mark.parametrize("fwd, bwd, match", [
    (power, pow_off_by_one, "off by one"),
    (power, pow_no_k, "factor k"),
    (lambda a, k: Value(a.data**k, (a,), "**"), pow_backward, "_arg"),
])
def test_power_rejects(fwd, bwd, match):
    expect_failure(check.power, fwd, bwd, match=match)


def tanh_from_input(out):
    (a,) = out._prev
    a.grad += (1 - a.data**2) * out.grad


def tanh_no_square(out):
    (a,) = out._prev
    a.grad += (1 - out.data) * out.grad


@pytest.mark.parametrize("bwd, match", [(tanh_from_input, "OUTPUT"), (tanh_no_square, "square it")])
def test_tanh_rejects(bwd, match):
    expect_failure(check.tanh, tanh, bwd, match=match)


def relu_always(out):
    (a,) = out._prev
    a.grad += out.grad


def relu_assign(out):
    (a,) = out._prev
    a.grad = (out.data > 0) * out.grad


@pytest.mark.parametrize("fwd, bwd, match", [
    (relu, relu_always, "positive"),
    (relu, relu_assign, "+="),
    (lambda a: Value(abs(a.data), (a,), "relu"), relu_backward, "differs"),
])
def test_relu_rejects(fwd, bwd, match):
    expect_failure(check.relu, fwd, bwd, match=match)


def topo_recursive(root):
    order, seen = [], set()

    def visit(v):
        if v not in seen:
            seen.add(v)
            for c in v._prev:
                visit(c)
            order.append(v)
    visit(root)
    return order


def topo_reversed(root):
    return topological_order(root)[::-1]


def topo_no_seen(root):
    order, stack = [], [(root, False)]
    while stack:
        v, done = stack.pop()
        if done:
            order.append(v)
        else:
            stack.append((v, True))
            stack.extend((c, False) for c in v._prev)
    return order


def topo_preorder(root):  # parents before some children: emitted on first visit
    order, seen, stack = [], set(), [root]
    while stack:
        v = stack.pop()
        if v not in seen:
            seen.add(v)
            order.append(v)
            stack.extend(v._prev)
    return order[::-1]


@pytest.mark.parametrize("wrong, match", [
    (topo_recursive, "RecursionError"),
    (topo_reversed, "reversed"),
    (topo_no_seen, "more than once"),
    (topo_preorder, "comes before its child"),
])
def test_topological_order_rejects(wrong, match):
    expect_failure(check.topological_order, wrong, match=match)


def backward_no_reset(root):
    root.grad = 1
    for v in reversed(topological_order(root)):
        v._backward()


def backward_forward_order(root):
    topo = topological_order(root)
    for v in topo:
        v.grad = 0
    root.grad = 1
    for v in topo:
        v._backward()


def backward_reset_leaves_only(root):
    topo = topological_order(root)
    for v in topo:
        if not v._prev:
            v.grad = 0
    root.grad = 1
    for v in reversed(topo):
        v._backward()


@pytest.mark.parametrize("wrong, match", [
    (backward_no_reset, "must start from nothing"),
    (backward_forward_order, "after the rules of every node"),
    (backward_reset_leaves_only, "differs"),
])
def test_backward_rejects(wrong, match):
    expect_failure(check.backward, wrong, match=match)


def neuron_no_bias(neuron, x):
    act = sum((wi * xi for wi, xi in zip(neuron.w, x)), Value(0.0))
    return act.relu() if neuron.nonlin else act


def neuron_always_relu(neuron, x):
    act = neuron.b
    for wi, xi in zip(neuron.w, x):
        act = act + wi * xi
    return act.relu()


def neuron_floats(neuron, x):
    return max(sum(w.data * v.data for w, v in zip(neuron.w, x)) + neuron.b.data, 0)


@pytest.mark.parametrize("wrong, match", [
    (neuron_no_bias, "bias"),
    (neuron_always_relu, "nonlin"),
    (neuron_floats, "expected a Value"),
])
def test_neuron_call_rejects(wrong, match):
    expect_failure(check.neuron_call, wrong, match=match)


@pytest.mark.parametrize("wrong, match", [
    (lambda m: [p for layer in m.layers for n in layer.neurons for p in n.w], "biases are missing"),
    (lambda m: [p for layer in m.layers for n in layer.neurons for p in [n.b] + n.w], "not the expected one"),
    (lambda m: [n.parameters() for layer in m.layers for n in layer.neurons], "flat list"),
    (lambda m: [p for n in m.layers[0].neurons for p in n.w + [n.b]], "parameters"),
])
def test_mlp_parameters_rejects(wrong, match):
    expect_failure(check.mlp_parameters, wrong, match=match)


def step_no_zero_grad(model, X, y, lr):
    loss = svm_loss(model, X, y)
    loss.backward()
    for p in model.parameters():
        p.data -= lr * p.grad
    return loss


def step_wrong_sign(model, X, y, lr):
    model.zero_grad()
    loss = svm_loss(model, X, y)
    loss.backward()
    for p in model.parameters():
        p.data += lr * p.grad
    return loss


def step_no_update(model, X, y, lr):
    model.zero_grad()
    loss = svm_loss(model, X, y)
    loss.backward()
    return loss


@pytest.mark.parametrize("wrong, match", [
    (step_no_zero_grad, "grads of the one before"),
    (step_wrong_sign, "differs"),
    (step_no_update, "did not change"),
])
def test_sgd_step_rejects(wrong, match):
    expect_failure(check.sgd_step, wrong, match=match)


def neuron_from_a_fresh_node(neuron, x):
    """Correct, written another way: the sum starts from a new node of the exercise's Value, the bias last."""
    act = Value(0.0)
    for wi, xi in zip(neuron.w, x):
        act = act + wi * xi
    act = act + neuron.b
    return act.relu() if neuron.nonlin else act


def test_neuron_call_accepts_a_sum_that_starts_from_a_fresh_node():
    expect_pass(check.neuron_call, neuron_from_a_fresh_node)
