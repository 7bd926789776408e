"""Chapter 11 on the learner's code: with the reference answers saved as a learner's, chapter 04's GPT trains
on 2 worker processes with the learner's ring, DDP, ZeRO-1 wrapper and tensor-parallel MLP, as one process
does; the workers run the learner's saved file, not the notebook; one wrong piece stops the assembly at
once, named; the switch gives the course's pieces."""

import carried
import pytest

from course_lib.checks import CheckFailed
from course_lib.distributed import Code, carry
from course_lib.yours import distributed

SIX = "ring_all_reduce, DDP, ZeroOptimizer, CopyToParallel, ReduceFromParallel, ParallelMLP"


saved, learner = carried.fixtures("11")   # the reference answers saved as a learner's; a copy per test


def test_the_learners_pieces_train_the_gpt_in_the_workers_as_one_process(learner, tmp_path, capsys):
    calls = tmp_path / "ring calls"
    carried.break_piece("11", "ring_all_reduce", "    me, size = dist.get_rank(), dist.get_world_size()\n",
                        "    me, size = dist.get_rank(), dist.get_world_size()\n"
                        f"    open({str(calls)!r}, 'a').write(f'{{me}}\\n')   # a trace, not a change\n")
    parts = distributed.assemble()
    assert f"chapter 11: your {SIX}; nothing of the course's" in capsys.readouterr().out
    assert all(piece.__module__ == "course_yours_ch11" for piece in parts.pieces.values())
    carried_ring = carry(parts.pieces["ring_all_reduce"])   # what reaches the workers: the saved file's text
    assert isinstance(carried_ring, Code) and carried_ring.filename == str(learner / "yours" / "ch11.py")
    before = calls.read_text().count("\n")                 # the check ran it again, in its own workers
    runs, one_process = parts.train_gpt(steps=3, world_size=2)
    assert set(runs) == {"your ring", "your DDP + ZeRO-1", "your tensor parallel"}
    for losses in runs.values():
        assert max(abs(a - b) for a, b in zip(losses, one_process)) < 1e-12
    assert calls.read_text().count("\n") - before == 2 * 3 * 2   # 2 ranks x 3 steps x (the gradients, the loss)


def test_a_wrong_piece_stops_the_assembly_named(learner):
    carried.break_piece("11", "ddp", "flat /= dist.get_world_size()", "flat *= 1")   # sums, never averages
    with pytest.raises(CheckFailed, match="your saved `ddp` \\(DDP\\)") as failure:
        distributed.assemble()
    assert "the gradients were summed, not averaged" in str(failure.value)


def test_the_switch_runs_the_courses_pieces(learner, capsys):
    with carried.switched_off("11"):
        parts = distributed.assemble()
    assert parts.pieces == distributed.COURSE
    assert f"chapter 11: your code switched off by yours.use; the course's {SIX}" in capsys.readouterr().out
    assert not any(parts.runs_yours(run) for run in ("ring", "ddp + zero", "tensor parallel"))


def test_the_payoff_stops_at_once_on_a_wrong_piece(learner):
    carried.break_piece("11", "ring_all_reduce", "target.add_(buf)", "target.copy_(buf)")   # overwrites, never adds
    carried.assert_payoff_stops_at_once("11", learner, "ring_all_reduce")
