"""Chapter 12 carried forward: the learner's saved attention, layer norm backward and embedding backward run
the capstone GPT as chapter 04's PyTorch GPT does; a wrong saved piece stops the assembly named; the
switch gives the course's pieces; chapter 02's matmul_backward and adam_step run inside it."""

import shutil

import nbformat
import numpy as np
import pytest
import torch

from course_lib import nbtools, yours
from course_lib.capstone import compare_training
from course_lib.checks import CheckFailed
from course_lib.gpt.model import GPT as TorchGPT
from course_lib.gpt.model import GPTConfig
from course_lib.gpt.trainer import TrainConfig
from course_lib.tensor import functions as F
from course_lib.yours import capstone
from course_lib.yours import tensor as yours_tensor
from tests import carried

CONFIG = GPTConfig(vocab_size=23, block_size=12, n_layer=2, n_head=3, n_embd=18, dropout=0.0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return carried.saved_workspace(tmp_path_factory, "12") / "yours"


@pytest.fixture
def learner(workspace, saved):
    shutil.copytree(saved, workspace / "yours")
    return workspace


def counting(parts, name, calls):
    fn = parts.pieces[name]
    parts.pieces[name] = lambda *a: calls.append(name) or fn(*a)


def test_the_learners_pieces_run_the_gpt_as_pytorch_does(learner, capsys):
    parts = capstone.assemble()
    assert "chapter 12: your layer_norm_backward, embedding_backward, causal_self_attention" in capsys.readouterr().out
    assert all(f.__module__ == "course_yours_ch12" for f in parts.pieces.values())
    calls = []
    for name in parts.pieces:
        counting(parts, name, calls)
    torch.manual_seed(0)
    theirs = TorchGPT(CONFIG).double()
    ours = parts.GPT.from_torch(theirs)
    idx, tgt = (np.random.default_rng(s).integers(0, CONFIG.vocab_size, (2, 11)) for s in (1, 2))
    with parts.running():
        logits, loss = ours(idx, tgt)
        loss.backward()
    their_logits, their_loss = theirs(torch.from_numpy(idx), torch.from_numpy(tgt))
    their_loss.backward()
    np.testing.assert_allclose(logits.numpy(), their_logits.detach().numpy(), rtol=0, atol=1e-12)
    named = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), named[name].grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)
    # each block: attention once, two layer norms; ln_f; the token and position embeddings
    assert sorted(set(calls)) == sorted(parts.pieces)
    assert calls.count("causal_self_attention") == 2 and calls.count("layer_norm_backward") == 5
    assert calls.count("embedding_backward") == 2
    assert F.LayerNorm.__name__ == "LayerNorm" and F.LayerNorm.__module__ == "course_lib.tensor.functions"


def test_training_runs_chapter_02s_matmul_backward_and_adam_step(learner, monkeypatch):
    ch02_calls = []
    assemble = yours_tensor.assemble

    def counted(quiet=False):
        ch02 = assemble(quiet=quiet)
        for name in ("matmul_backward", "adam_step"):
            fn = ch02.pieces[name]
            ch02.pieces[name] = lambda *a, fn=fn, name=name: ch02_calls.append(name) or fn(*a)
        return ch02

    monkeypatch.setattr(yours_tensor, "assemble", counted)
    parts = capstone.assemble(quiet=True)
    tokens = np.random.default_rng(3).integers(0, CONFIG.vocab_size, 400)
    with parts.running():
        theirs, ours = compare_training(CONFIG, TrainConfig(batch_size=3, lr=1e-3, warmup_iters=2), tokens, 4,
                                        gpt=parts.GPT, make_optimizer=parts.configure_optimizer)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)
    assert ch02_calls.count("adam_step") == 4                 # one update of the flat parameter vector per step
    assert ch02_calls.count("matmul_backward") > 0


def test_a_wrong_piece_stops_the_assembly_named_and_the_switch_gives_the_courses(learner, capsys):
    carried.break_piece("12", "embedding_backward", "np.add.at(d_weight, idx.reshape(-1), grad.reshape(-1, D))",
                        "d_weight[idx.reshape(-1)] += grad.reshape(-1, D)")
    with pytest.raises(CheckFailed, match="your saved `embedding_backward`") as failure:
        capstone.assemble()
    assert "write each row once" in str(failure.value)
    yours.use("12", False)
    try:
        parts = capstone.assemble()
    finally:
        yours.use("12", True)
    assert parts.pieces == capstone.COURSE
    assert "the course's layer_norm_backward, embedding_backward, causal_self_attention" in capsys.readouterr().out


def test_nothing_saved_runs_the_courses_pieces_equal_to_pytorch(workspace):
    parts = capstone.assemble(quiet=True)
    assert parts.pieces == capstone.COURSE
    torch.manual_seed(1)
    theirs = TorchGPT(CONFIG).double()
    ours = parts.GPT.from_torch(theirs)
    idx = np.random.default_rng(4).integers(0, CONFIG.vocab_size, (3, 12))
    with parts.running():
        logits, _ = ours(idx)
    np.testing.assert_allclose(logits.numpy(), theirs(torch.from_numpy(idx))[0].detach().numpy(), atol=1e-12)


def test_the_payoff_stops_at_once_on_a_wrong_piece(learner):
    carried.break_piece("12", "causal_self_attention", "k=1", "k=0")   # hides the diagonal too
    (learner / "exercises").mkdir(exist_ok=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in carried.payoff_cells("12")])
    nb = nbtools.execute(nb, cwd=learner / "exercises", allow_errors=True)
    errors = [(k, o) for k, c in enumerate(nb.cells) for o in c.outputs if o.output_type == "error"]
    (cell, error), *_ = errors
    assert cell == 0 and error.ename == "CheckFailed" and "your saved `causal_self_attention`" in error.evalue
    assert "hides the diagonal" in error.evalue
