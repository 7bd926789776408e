"""Graph mode against PyTorch: values, gradients, second derivatives, passes, errors, tracing."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib import graph as G
from course_lib.graph import passes


def _torch(x):
    return torch.tensor(x, dtype=torch.float64, requires_grad=True)


def _model(lib, x, w, b, v):
    """One expression written once, run by the graph and by torch (same method names)."""
    h = (x @ w + b).sigmoid()
    return (h * h + (h * v).exp()).sum() / 7.0 + (h.relu() ** 2).mean() - (x @ w).exp().mean() * 0.1


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 7), k=st.integers(1, 6), m=st.integers(1, 6), seed=st.integers(0, 10**6))
def test_values_and_gradients_match_torch(n, k, m, seed):
    rng = np.random.default_rng(seed)
    X, W, B, V = rng.normal(size=(n, k)), rng.normal(size=(k, m)), rng.normal(size=(m,)), rng.normal(size=(1, m))
    with G.Graph():
        x = G.placeholder((None, k))
        w, b, v = G.variable(W), G.variable(B), G.constant(V)
        y = _model(G, x, w, b, v)
        grads = G.gradients(y, [x, w, b])
    out = G.Session().run([y] + grads, {x: X})
    tx, tw, tb = _torch(X), _torch(W), _torch(B)
    ty = _model(torch, tx, tw, tb, torch.tensor(V))
    ty.backward()
    for mine, ref in zip(out, [ty, tx.grad, tw.grad, tb.grad]):
        np.testing.assert_allclose(mine, ref.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_hessian_vector_product_matches_torch():
    rng = np.random.default_rng(1)
    X, W, B, V = rng.normal(size=(5, 4)), rng.normal(size=(4, 3)), rng.normal(size=(3,)), rng.normal(size=(4, 3))
    with G.Graph():
        x, w, b = G.placeholder((5, 4)), G.variable(W), G.variable(B)
        y = _model(G, x, w, b, G.constant(np.ones((1, 3)) * 0.3))
        (gw,) = G.gradients(y, [w])
        (hv,) = G.gradients((gw * G.constant(V)).sum(), [w])
    mine = G.Session().run(hv, {x: X})
    f = lambda Wt: _model(torch, torch.tensor(X), Wt, torch.tensor(B), torch.full((1, 3), 0.3, dtype=torch.float64))
    _, ref = torch.autograd.functional.hvp(f, torch.tensor(W), torch.tensor(V))
    np.testing.assert_allclose(mine, ref.numpy(), rtol=1e-10, atol=1e-12)


def test_softmax_cross_entropy_and_its_gradient():
    rng = np.random.default_rng(2)
    Z, labels = rng.normal(size=(6, 5)) * 30, rng.integers(0, 5, 6)
    Y = np.eye(5)[labels]
    with G.Graph():
        z = G.placeholder((None, 5))
        loss = G.softmax_cross_entropy(z, G.constant(Y))
        (gz,) = G.gradients(loss, [z])
        (g2,) = G.gradients((gz * gz).sum(), [z])  # a second derivative through softmax
    out = G.Session().run([loss, gz, g2], {z: Z})
    tz = _torch(Z)
    tl = torch.nn.functional.cross_entropy(tz, torch.tensor(labels))
    (tg,) = torch.autograd.grad(tl, tz, create_graph=True)
    (tg2,) = torch.autograd.grad((tg * tg).sum(), tz)
    for mine, ref in zip(out, [tl, tg, tg2]):
        np.testing.assert_allclose(mine, ref.detach().numpy(), rtol=1e-9, atol=1e-12)


def test_run_evaluates_only_what_the_fetch_needs():
    with G.Graph():
        x = G.placeholder((3,))
        used = x * 2.0
        unused = G.log(G.constant(-1.0) * x)  # would warn and give nan if it ran
    calls = []
    original = type(unused.op).compute
    type(unused.op).compute = lambda self, node, *v: calls.append(node) or original(self, node, *v)
    try:
        G.Session().run(used, {x: np.array([1.0, 2.0, 3.0])})
    finally:
        type(unused.op).compute = original
    assert calls == []


def test_deep_chain_needs_no_recursion():
    with G.Graph():
        x = G.placeholder(())
        y = x
        for _ in range(20_000):
            y = y * 1.0001
        (g,) = G.gradients(y, [x])
    val, grad = G.Session().run([y, g], {x: 1.5})
    assert np.isclose(val, 1.5 * 1.0001**20_000) and np.isclose(grad, 1.0001**20_000)


def test_errors_are_clear():
    with G.Graph():
        with pytest.raises(G.ShapeError, match=r"inner dimensions differ: \(3, 4\) @ \(5, 2\)"):
            G.placeholder((3, 4)) @ G.placeholder((5, 2))
        with pytest.raises(G.ShapeError, match="do not broadcast"):
            G.placeholder((3, 4)) + G.placeholder((3,))
        x = G.placeholder((None, 4), name="x")
        y = (x * 2.0).sum()
    with pytest.raises(G.FeedError, match="x of shape .* needs a value"):
        G.Session().run(y)
    with pytest.raises(G.FeedError, match=r"expects shape \(None, 4\).*fed shape \(2, 5\)"):
        G.Session().run(y, {x: np.arange(10.0).reshape(2, 5)})


@pytest.mark.parametrize("build, match", [
    (lambda x, s, b: x.sum(dim=2), r"sum: dimension 2 is out of range for shape \(3, 4\)"),
    (lambda x, s, b: x.sum(dim=-3), r"sum: dimension -3 is out of range"),
    (lambda x, s, b: x.mean(dim=(1, -1)), r"sum: dimensions \(1, -1\) repeat"),
    (lambda x, s, b: s.sum(dim=0), r"sum: dimension 0 is out of range for shape \(\).*scalar"),
    (lambda x, s, b: s.sum(dim=-1, keepdim=True), r"scalar"),
    (lambda x, s, b: x.reshape(5, -1), r"reshape: cannot view \(3, 4\) \(12 elements\) as \(5, -1\)"),
    (lambda x, s, b: x.reshape(5, 3), r"reshape: cannot view \(3, 4\)"),
    (lambda x, s, b: x.reshape(-1, -1), r"at most one -1"),
    (lambda x, s, b: b.reshape(6), r"reshape: cannot view \(None, 4\) \(4 elements times the unknown"),
    (lambda x, s, b: x @ x, r"matmul: inner dimensions differ: \(3, 4\) @ \(3, 4\)"),
    (lambda x, s, b: x @ s, r"matmul: both inputs must be 2-D"),
    (lambda x, s, b: x + G.placeholder((3,)), r"add: shapes \(3, 4\) and \(3,\) do not broadcast"),
    (lambda x, s, b: G.softmax(s), r"softmax: needs at least 1 dimension"),
    (lambda x, s, b: G.softmax_cross_entropy(x, G.placeholder((3,))), r"softmax_cross_entropy: .*\(3,\)"),
    (lambda x, s, b: G.placeholder((2.5, 3)), r"placeholder: \(2.5, 3\) is not a shape"),
])
def test_shape_errors_at_definition_time(build, match):
    with G.Graph():
        x, s, b = G.placeholder((3, 4), name="x"), G.placeholder((), name="s"), G.placeholder((None, 4), name="b")
        with pytest.raises(G.ShapeError, match=match):
            build(x, s, b)


def test_valid_dims_and_reshapes_still_work():
    rng = np.random.default_rng(6)
    X = rng.normal(size=(3, 4))
    with G.Graph():
        x, b = G.placeholder((3, 4)), G.placeholder((None, 4))
        outs = [x.sum(dim=-1), x.sum(dim=(0, 1)), x.sum(dim=-2, keepdim=True), x.reshape(2, -1), b.reshape(-1, 2),
                b.reshape(8), G.placeholder(()).sum()]
    assert [o.shape for o in outs] == [(3,), (), (1, 4), (2, 6), (None, 2), (8,), ()]
    vals = G.Session().run(outs[:6], {x: X, b: X[:2]})
    for mine, ref in zip(vals, [X.sum(-1), X.sum(), X.sum(-2, keepdims=True), X.reshape(2, 6), X[:2].reshape(-1, 2),
                                X[:2].reshape(8)]):
        np.testing.assert_array_equal(mine, ref)


def test_gradient_of_a_sum_over_an_unknown_batch_dimension():
    X = np.random.default_rng(7).normal(size=(4, 3))
    with G.Graph():
        x = G.placeholder((None, 3))
        (g0,) = G.gradients((x * x).sum(dim=1).sum(), [x])
        (g1,) = G.gradients((x.exp().mean(dim=0) * 2.0).sum(), [x])
    np.testing.assert_allclose(G.Session().run(g0, {x: X}), 2 * X, rtol=1e-12)
    np.testing.assert_allclose(G.Session().run(g1, {x: X}), 2 * np.exp(X) / 4, rtol=1e-12)


def test_sgd_step_trains_and_variables_persist():
    rng = np.random.default_rng(3)
    X, true_w = rng.normal(size=(40, 3)), np.array([[1.5], [-2.0], [0.7]])
    with G.Graph():
        x, t = G.placeholder((None, 3)), G.placeholder((None, 1))
        w = G.variable(rng.normal(size=(3, 1)))
        loss = ((x @ w - t) ** 2).mean()
        train = G.sgd_step(loss, [w], lr=0.1)
    sess = G.Session()
    losses = [sess.run([loss] + train, {x: X, t: X @ true_w})[0] for _ in range(200)]
    assert losses[-1] < 1e-6 * losses[0]
    np.testing.assert_allclose(sess.value_of(w), true_w, atol=1e-3)


def _random_graph(rng):
    with G.Graph() as g:
        x = G.placeholder((4, 3), name="x")
        w = G.variable(rng.normal(size=(3, 3)), name="w")
        c = G.constant(rng.normal(size=(3,))) * G.constant(2.0) + G.constant(0.0)
        a = (x @ w + c) * 1.0
        b = (x @ w + c).exp()  # the same expression again: CSE merges it
        y = (a * b + (b * a)).sum() + G.constant(3.0) ** 1
    return g, x, w, y


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_passes_keep_results_and_shrink_the_graph(seed):
    rng = np.random.default_rng(seed)
    g, x, w, y = _random_graph(rng)
    (gw,) = G.gradients(y, [w])
    X = rng.normal(size=(4, 3))
    sess = G.Session()
    before = sess.run([y, gw], {x: X})
    outputs = [y, gw]
    n = passes.count_nodes(outputs)
    for p in (passes.simplify, passes.fold_constants, passes.eliminate_common_subexpressions):
        new = p(outputs)
        assert passes.count_nodes(new) < passes.count_nodes(outputs), p.__name__
        for a, b in zip(before, sess.run(new, {x: X})):
            np.testing.assert_allclose(b, a, rtol=1e-12)
        outputs = new
    assert passes.count_nodes(G.optimize([y, gw])) <= passes.count_nodes(outputs) < n


def test_folding_never_freezes_placeholders_or_variables():
    with G.Graph():
        x, v = G.placeholder(()), G.variable(2.0)
        y = (x * G.constant(3.0)) + v * (G.constant(1.0) + G.constant(1.0))
        step = G.assign(v, v + 1.0)
    (folded,) = G.fold_constants([y])
    sess = G.Session()
    assert sess.run(folded, {x: 1.0}) == 3.0 + 4.0
    sess.run(step)
    assert sess.run(folded, {x: 2.0}) == 6.0 + 6.0


def test_simplify_respects_broadcasting():
    with G.Graph():
        x = G.placeholder((4,))
        y = x + G.constant(np.zeros((3, 4)))  # broadcasts: not x
        z = x * 1.0
    ys, zs = G.simplify([y, z])
    assert ys.shape == (3, 4) and zs is x


def test_dead_node_elimination():
    with G.Graph() as g:
        x = G.placeholder((2,))
        y = x * 2.0
        _debug = (x + 1.0).exp()
    pruned = G.eliminate_dead_nodes(g, [y])
    assert len(pruned.nodes) == 3 and len(g.nodes) == 6


def test_trace_matches_eager_torch_and_refuses_control_flow():
    rng = np.random.default_rng(4)
    W1, W2 = torch.tensor(rng.normal(size=(5, 8))), torch.tensor(rng.normal(size=(8, 2)))

    def mlp(x):
        return ((x @ W1).relu() @ W2).sigmoid().sum(dim=1, keepdim=True)

    X = rng.normal(size=(6, 5))
    f = G.trace(mlp, X)
    np.testing.assert_allclose(f(X), mlp(torch.tensor(X)).numpy(), rtol=1e-12)
    np.testing.assert_allclose(f(X[:3]), mlp(torch.tensor(X[:3])).numpy(), rtol=1e-12)

    def branchy(x):
        return x if x.sum() > 0 else -x

    with pytest.raises(G.TraceError, match="control flow"):
        G.trace(branchy, X)


def test_trace_of_a_chapter02_function_matches_its_eager_values_and_gradients():
    from course_lib import tensor as T

    rng = np.random.default_rng(5)
    W1, W2 = T.Tensor(rng.normal(size=(5, 7))), T.Tensor(rng.normal(size=(7, 3)))

    def net(x):
        return ((x @ W1).relu() @ W2).sigmoid().sum(dim=1, keepdim=True).exp().mean()

    X = rng.normal(size=(9, 5))
    f = G.trace(net, X)
    with f.graph:
        (dx,) = G.gradients(f.output, f.inputs)
    value, grad = G.Session().run([f.output, dx], {f.inputs[0]: X})
    tx = T.Tensor(X, requires_grad=True)
    eager = net(tx)
    eager.backward()
    np.testing.assert_allclose(value, eager.numpy(), rtol=1e-12)
    np.testing.assert_allclose(grad, tx.grad.numpy(), rtol=1e-10, atol=1e-14)
