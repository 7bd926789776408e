"""Chapter 13 carried forward: the learner's saved record, can_join, pointwise_source and guard compile the
capstone GPT's training step, equal to chapter 12's eager step in float64; a wrong saved piece stops the
assembly named; the switch gives the course's pieces; the payoff stops at once on a wrong piece; with
chapter 12 saved too, the payoff compiles the learner's own chapter 12 GPT, equal to its eager step."""

import carried
import numpy as np
import pytest
import torch

from course_lib.capstone import GPT
from course_lib.capstone import configure_optimizer as eager_optimizer
from course_lib.capstone import train_step as eager_step
from course_lib.checks import CheckFailed
from course_lib.compiler import Pieces
from course_lib.compiler.capturable import CAPTURABLE
from course_lib.gpt.model import GPT as TorchGPT
from course_lib.gpt.model import GPTConfig
from course_lib.gpt.trainer import TrainConfig, train_step
from course_lib.gpt.trainer import configure_optimizer as recipe_optimizer
from course_lib.yours import compiler, meter

CONFIG = GPTConfig(vocab_size=17, block_size=10, n_layer=2, n_head=2, n_embd=12, dropout=0.0)


saved, learner = carried.fixtures("13")   # the reference answers saved as a learner's; a copy per test


def counted(fn, calls, name):
    def wrapped(*args):
        calls[name] = calls.get(name, 0) + 1
        return fn(*args)
    return wrapped


def test_the_learners_pieces_compile_the_gpt_step(learner, capsys):
    pieces = compiler.assemble()
    assert "chapter 13: your record, can_join, pointwise_source, guard" in capsys.readouterr().out
    mine = (pieces.record, pieces.can_join, pieces.pointwise, pieces.guard)
    assert all(f.__module__ == "course_yours_ch13" for f in mine)
    calls = {}
    pieces = Pieces(*(counted(f, calls, name) for f, name in zip(mine, ("record", "can_join", "pointwise", "guard"))))
    torch.manual_seed(0)
    reference = TorchGPT(CONFIG).double()
    eager_gpt, gpt = GPT.from_torch(reference), GPT.from_torch(reference)
    eager_opt, opt = eager_optimizer(eager_gpt, TrainConfig()), recipe_optimizer(gpt, TrainConfig(), CAPTURABLE)
    step = compiler.compile(train_step, pieces, verbose=False)
    rng = np.random.default_rng(0)
    for _ in range(8):
        x, y = (rng.integers(0, CONFIG.vocab_size, (2, 9)) for _ in range(2))
        assert abs(step(gpt, opt, x, y, 1.0, CAPTURABLE).item() - eager_step(eager_gpt, eager_opt, x, y).item()) <= 1e-12
    for p, q in zip(eager_gpt.parameters(), gpt.parameters()):
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-9, atol=1e-12)
    assert step.stats.replays == 5
    # every backend call of the three captures, every node offered to a group, the plain kernels, every call
    assert calls["record"] > 3 * 300 and calls["can_join"] > 100 and calls["pointwise"] > 3 and calls["guard"] >= 5


def test_a_wrong_piece_stops_the_assembly_named_and_the_switch_gives_the_courses(learner, capsys):
    carried.break_piece("13", "can_join", "producer.start > group.first", "False")
    with pytest.raises(CheckFailed, match="your saved `can_join`") as failure:
        compiler.assemble()
    assert "starts after this one" in str(failure.value)
    with carried.switched_off("13"):
        pieces = compiler.assemble()
    assert (pieces.record, pieces.can_join, pieces.pointwise, pieces.guard) == tuple(compiler.COURSE.values())
    assert "the course's record, can_join, pointwise_source, guard" in capsys.readouterr().out


def test_nothing_saved_runs_the_courses_pieces(workspace):
    pieces = compiler.assemble(quiet=True)
    assert (pieces.record, pieces.can_join, pieces.pointwise, pieces.guard) == tuple(compiler.COURSE.values())


def test_the_payoff_stops_at_once_on_a_wrong_piece(learner):
    carried.break_piece("13", "guard", "if dtype != entry[2]:", "if False:")
    assert "another dtype" in carried.assert_payoff_stops_at_once("13", learner, "guard")


def test_the_payoff_compiles_the_learners_chapter_12_gpt(tmp_path_factory, monkeypatch):
    """Chapters 01, 02, 06, 12 and 13 saved: the payoff's GPT is the learner's chapter 12 assembly, compiled by
    their compiler; their numpy backwards (Embedding, matmul_backward, cross-entropy) replay as islands, and
    the compiled losses and gradients equal the eager step's on their library within 1e-12."""
    work = carried.saved_workspace(tmp_path_factory, "01", "02", "06", "12", "13")   # chapter 12's GPT needs all four
    monkeypatch.setenv("COURSE_WORKSPACE", str(work))
    monkeypatch.delenv("COURSE_PROGRESS_FILE", raising=False)
    namespace, out = carried.run_payoff("13")
    assert "chapter 13: your record, can_join, pointwise_source, guard" in out
    assert ("chapter 12: your Softmax, GELU, LayerNorm, Embedding, MaskedFill, CausalAttention, Block, GPT" in out
            and "chapter 02: your Mul, Sum, matmul_backward" in out), out
    parts, step = namespace["parts"], namespace["step"]
    assert meter.whose(parts.functions["Embedding"]) == "yours" and meter.whose(parts.functions["MatMul"]) == "yours"
    for op in ("Embedding.backward", "MatMul.backward", "CrossEntropy.forward"):
        assert f"{op} works outside the backend" in out, out
    assert step.stats.eager == 0 and step.program.counts()["island"] > 0
    assert step.stats.replays >= 17   # the equality's 17, then the timing's
    assert max(namespace["gaps"]) <= 1e-12 and namespace["grad_gap"] <= 1e-12
    assert "losses equal within 1e-12: True; every gradient equal within 1e-12: True" in out
