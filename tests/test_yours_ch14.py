"""Chapter 14 carried forward: the learner's saved pieces serve the GPT.

The reference answers are saved as a learner's (the solved notebook run from a workspace's exercises/), then
the payoff cells run on them: the server streams concurrent requests through their engine (their scheduler,
block manager and paged attention), speculative decoding keeps drafts by their rule, and their int8 kernel
runs the GPT. A wrong saved piece stops the payoff at once, named; the switch, or nothing saved, gives the
course's pieces.
"""

import carried
import numpy as np
import pytest

from course_lib.checks import CheckFailed
from course_lib.serve import blocks, scheduler
from course_lib.serve.models import load_pair
from course_lib.yours import serve

saved, learner = carried.fixtures("14")


def test_the_payoff_serves_on_the_learners_pieces(saved, monkeypatch):
    monkeypatch.setenv("COURSE_WORKSPACE", str(saved))
    namespace, text = carried.run_payoff("14")
    assert ("chapter 14: your BlockManager, paged_attention, schedule, accept, quantize, int8_matmul; "
            "nothing of the course's") in text
    assert "12 concurrent streams: all complete True, each equal to the request served alone: True" in text
    assert "blocks held after the last request: 0 of 48" in text
    assert "speculative = target alone: True" in text
    pieces = namespace["pieces"]
    assert {getattr(f, "py_func", f).__module__ for f in pieces.pieces.values()} == {"course_yours_ch14"}
    engine = namespace["engine"]
    assert type(engine.blocks).__module__ == "course_yours_ch14" and engine.schedule.__module__ == "course_yours_ch14"
    assert any(len(step) > 1 for step in namespace["trace"])             # requests shared steps


def test_a_wrong_piece_stops_the_payoff_at_once_named(learner):
    carried.break_piece("14", "schedule", "victim = running.pop()", "victim = running.pop(0)")   # the oldest
    namespace = {}
    with pytest.raises(CheckFailed, match="your saved `schedule`"):
        carried.run_payoff("14", namespace)
    assert "engine" not in namespace                                     # stopped before the server started


def test_switched_off_or_nothing_saved_the_courses_pieces_run(learner, tmp_path, monkeypatch, capsys):
    with carried.switched_off("14"):
        pieces = serve.assemble()
    assert pieces.pieces == serve.COURSE and pieces.mine() == []
    assert "the course's BlockManager, paged_attention, schedule, accept, quantize, int8_matmul" in capsys.readouterr().out
    monkeypatch.setenv("COURSE_WORKSPACE", str(tmp_path / "empty"))
    pieces = serve.assemble(quiet=True)
    engine = pieces.engine(load_pair().target, 16, 8, np.float64)
    assert isinstance(engine.blocks, blocks.BlockManager) and engine.schedule is scheduler.schedule
