"""The chapter 01 engine: micrograd's API and results, depth, re-running backward, no cycles, pictures."""

import gc
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from micrograd import engine as mg_engine
from micrograd import nn as mg_nn

from course_lib.autograd import MLP, Layer, Neuron, Value, graph_of, topological_order


def expression(a, b):
    """micrograd's own test expression, using every operator form."""
    c = a + b
    d = a * b + b**3
    c += c + 1
    c += 1 + c + (-a)
    d += d * 2 + (b + a).relu()
    d += 3 * d + (b - a).relu()
    e = c - d
    f = e**2
    g = f / 2.0
    g += 10.0 / f
    return g


def test_matches_micrograd_and_torch():
    ours = [Value(-4.0), Value(2.0)]
    theirs = [mg_engine.Value(-4.0), mg_engine.Value(2.0)]
    ts = [torch.tensor(-4.0, dtype=torch.float64, requires_grad=True), torch.tensor(2.0, dtype=torch.float64, requires_grad=True)]
    g, mg, tg = expression(*ours), expression(*theirs), expression(*ts)
    g.backward(), mg.backward(), tg.backward()
    assert g.data == pytest.approx(mg.data, rel=1e-12) == pytest.approx(tg.item(), rel=1e-12)
    for o, m, t in zip(ours, theirs, ts):
        assert o.grad == pytest.approx(m.grad, rel=1e-12)
        assert o.grad == pytest.approx(t.grad.item(), rel=1e-12)


@settings(max_examples=15, deadline=None)
@given(st.floats(0.2, 2.0), st.floats(-2.0, 2.0), st.sampled_from([2, 3, -1, 0.5, -1.5]))
def test_unary_ops_against_torch(x, y, k):
    a, b = Value(x), Value(y)
    out = (a**k * b).tanh() + (a.log() * b).exp() + (b - 0.1).relu() / a
    out.backward()
    ta, tb = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x, y))
    tout = (ta**k * tb).tanh() + (ta.log() * tb).exp() + (tb - 0.1).relu() / ta
    tout.backward()
    assert out.data == pytest.approx(tout.item(), rel=1e-10, abs=1e-12)
    assert a.grad == pytest.approx(ta.grad.item(), rel=1e-9, abs=1e-12)
    assert b.grad == pytest.approx(tb.grad.item(), rel=1e-9, abs=1e-12)


def test_reflected_operators():
    x = Value(3.0)
    assert (2 * x).data == 6.0 and (1 - x).data == -2.0 and (10 / x).data == pytest.approx(10 / 3)
    assert (x + 1).data == 4.0 and (-x).data == -3.0 and (x**2).data == 9.0
    assert Value(5).grad == 0


def test_chain_100000_deep():
    x = Value(1.0)
    y = x
    for _ in range(100_000):
        y = y * 1.00001
    y.backward()
    assert x.grad == pytest.approx(1.00001**100_000, rel=1e-9)
    order = topological_order(y)
    assert len(order) == 200_001 and order[-1] is y  # x, then a constant and a product per link
    del order, y  # freeing the chain must not overflow the C stack either


def test_backward_twice_gives_the_same_grads():
    a, b = Value(1.5), Value(-0.7)
    c = a * b + a          # a is used twice
    d = (c * c).tanh() + b
    d.backward()
    first = (a.grad, b.grad, c.grad, d.grad)
    d.backward()
    assert (a.grad, b.grad, c.grad, d.grad) == first
    a.grad = 123.0         # even stale grads are overwritten
    d.backward()
    assert (a.grad, b.grad, c.grad, d.grad) == first


def test_backward_of_a_subgraph_resets_only_that_subgraph():
    a, b = Value(2.0), Value(3.0)
    c = a * b
    d = c + b
    d.backward()
    c.backward()            # d/da of c = b, d/db of c = a; d is not under c and keeps its grad
    assert (a.grad, b.grad, d.grad) == (3.0, 2.0, 1)


def garbage_in_cycles(Value):
    """How many objects only the cycle collector can free after a small graph is dropped."""
    gc.collect()
    gc.disable()
    try:
        a = Value(0.5)
        out = ((a * 2 + 1) ** 2).relu() * a
        out.backward()
        del a, out
        return gc.collect()
    finally:
        gc.enable()


def test_a_graph_has_no_reference_cycles():
    assert garbage_in_cycles(Value) == 0
    assert garbage_in_cycles(mg_engine.Value) > 0  # micrograd's closures make cycles


def test_nn_matches_micrograd():
    random.seed(3)
    ours = MLP(3, [4, 5, 1])
    random.seed(3)
    theirs = mg_nn.MLP(3, [4, 5, 1])
    assert [p.data for p in ours.parameters()] == [p.data for p in theirs.parameters()]
    assert len(ours.parameters()) == 4 * 4 + 5 * 5 + 6 == len(theirs.parameters())
    x = [0.3, -1.2, 0.8]
    yo, yt = ours(x), theirs(x)
    yo.backward(), yt.backward()
    assert yo.data == pytest.approx(yt.data, rel=1e-12)
    assert [p.grad for p in ours.parameters()] == pytest.approx([p.grad for p in theirs.parameters()], rel=1e-12)
    ours.zero_grad()
    assert all(p.grad == 0 for p in ours.parameters())
    assert not Neuron(2, nonlin=False).nonlin and isinstance(Layer(2, 3)([1.0, 2.0]), list)
    assert repr(ours).startswith("MLP of [Layer of [ReLUNeuron(3)")


def test_graph_of_lists_values_and_ops():
    a, b = Value(2.0, label="a"), Value(-3.0, label="b")
    c = a * b + a**2
    c.label = "c"
    c.backward()
    nodes, edges = graph_of(c)
    labels = [n["label"] for n in nodes]
    assert "a | data 2.0000 | grad 1.0000" in labels
    assert {"*", "+", "**2"} <= set(labels)
    assert len(edges) == 3 + 2 + 2 + 1  # op->value for each op node, plus each op's inputs
    ids = {n["id"] for n in nodes}
    assert all(src in ids and dst in ids for src, dst in edges)
