"""Chapter 01 on the learner's code: with the reference answers saved as a learner's, the assembled engine
is made of them and the payoff reaches its figure; one wrong piece stops it at once, named."""

import math

import carried
import matplotlib
import pytest

from course_lib.checks import CheckFailed
from course_lib.yours import autograd

matplotlib.use("Agg")


saved, learner = carried.fixtures("01")   # the reference answers saved as a learner's; a copy per test


def test_the_engine_is_the_learners_and_the_payoff_trains(learner, capsys):
    eng = autograd.engine()
    assert "nothing of the course's" in capsys.readouterr().out
    assert all(f.__module__ == "course_yours_ch01" for f in eng.pieces.values())
    a, b = eng.Value(1.5), eng.Value(-2.0)
    out = (a * b).tanh() + (a ** 2).exp() * b.relu()
    assert type(out) is eng.Value and all(type(c) is eng.Value for c in out._prev)
    out.backward()
    assert a.grad != 0 and b.grad != 0
    model = eng.MLP(2, [3, 1])
    assert all(type(p) is eng.Value for p in model.parameters())

    namespace = {}
    for cell in carried.payoff_cells("01"):
        exec(cell, namespace)
    assert namespace["accuracy"] >= 0.9, namespace["accuracy"]
    assert namespace["losses"][-1] < namespace["losses"][0] / 3
    assert type(namespace["model"].parameters()[0]) is namespace["eng"].Value


def test_a_wrong_piece_stops_the_engine_named(learner):
    carried.break_piece("01", "mul", "a.grad += b.data * out.grad", "a.grad = b.data * out.grad")
    with pytest.raises(CheckFailed, match="(?s)your saved `mul`.*\\(\\+=\\)"):
        autograd.engine(quiet=True)


def test_the_switch_runs_the_courses_pieces(learner):
    with carried.switched_off("01"):
        eng = autograd.engine(quiet=True)
    assert eng.pieces == autograd.COURSE
    x = eng.Value(0.3)
    y = x * x + x.tanh()
    y.backward()
    assert type(y) is eng.Value and abs(x.grad - (0.6 + 1 - math.tanh(0.3) ** 2)) < 1e-12
