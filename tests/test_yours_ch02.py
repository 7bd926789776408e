"""Chapter 02 on the learner's code: with the reference answers saved as a learner's, the digits MLP is
built from them and the payoff reaches 95% test accuracy; one wrong piece stops it at once, named."""

import carried
import matplotlib
import numpy as np
import pytest

from course_lib.checks import CheckFailed
from course_lib.yours import tensor

matplotlib.use("Agg")


saved, learner = carried.fixtures("02")   # the reference answers saved as a learner's; a copy per test


def test_the_parts_are_the_learners_and_the_payoff_reaches_95_percent(learner, capsys):
    namespace = {}
    for cell in carried.payoff_cells("02"):
        exec(cell, namespace)
    assert "nothing of the course's" in capsys.readouterr().out
    parts = namespace["parts"]
    assert all(f.__module__ == "course_yours_ch02" for f in parts.pieces.values())
    assert parts.Linear.__module__ == "course_yours_ch02" and parts.Tensor.__module__ == "course_yours_ch02"
    assert namespace["result"]["accuracy"] >= 0.95, namespace["result"]["accuracy"]
    assert namespace["with_sgd"]["accuracy"] >= 0.95, namespace["with_sgd"]["accuracy"]
    assert np.mean(namespace["result"]["losses"][-20:]) < namespace["result"]["losses"][0] / 5


def test_a_wrong_piece_stops_the_assembly_named(learner):
    carried.break_piece("02", "optimizer_steps", "m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)", "m_hat, v_hat = m, v")
    with pytest.raises(CheckFailed, match="(?s)your saved `optimizer_steps`.*without its bias correction"):
        tensor.train_digits(quiet=True)


def test_the_switch_runs_the_courses_pieces(learner, capsys):
    with carried.switched_off("02"):
        result = tensor.train_digits(epochs=10)
    assert "the course's broadcast_shape" in capsys.readouterr().out
    assert result["accuracy"] >= 0.95 and result["seconds_per_epoch"] > 0
    parts = tensor.assemble(quiet=True)
    assert parts.pieces["adam_step"].__module__ == "course_yours_ch02"
