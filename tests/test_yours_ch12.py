"""Chapter 12 carried forward: with the reference answers of chapters 01, 02, 06 and 12 saved as a learner's,
chapter 04's GPT and its whole training run on the learner's pieces (their GPT, optimizer, schedule,
clipping, loop and sampler; their Functions through the op registry, their chapter 06 kernels as the
backend, their topological order walking the backward, their adam_step inside their AdamW) and equal
PyTorch's in logits, gradients and losses; at least 90% of a step's computing calls run their code; the
learner's modules are never written into; a wrong saved piece stops the assembly and the payoff at once,
named; with nothing saved, or switched off, the course's pieces run, and the line says so."""

import shutil
import sys

import carried
import numpy as np
import pytest
import torch

from course_lib.checks import CheckFailed
from course_lib.gpt import trainer
from course_lib.gpt.data import Batches
from course_lib.gpt.model import GPT as TorchGPT
from course_lib.gpt.model import GPTConfig
from course_lib.gpt.trainer import TrainConfig
from course_lib.tensor import OPS, functions
from course_lib.yours import ch12_capstone as capstone
from course_lib.yours import meter

CONFIG = GPTConfig(vocab_size=23, block_size=12, n_layer=2, n_head=3, n_embd=18, dropout=0.0)
# chapter 12's assembly runs the learner's pieces of chapters 01, 02 and 06 too: all four saved; a copy per test
saved, learner = carried.fixtures("01", "02", "06", "12")


@pytest.fixture(scope="module")
def assembled(saved, tmp_path_factory):
    """One assembly for the tests that only run it: each assembly loads the saved modules afresh, and
    Numba compiles a fresh module's kernels again."""
    work = tmp_path_factory.mktemp("assembled") / "work"
    shutil.copytree(saved, work)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COURSE_WORKSPACE", str(work))
        yield capstone.assemble()


def _batch(seed, shape=(2, 11)):
    return np.random.default_rng(seed).integers(0, CONFIG.vocab_size, shape)


def test_the_learners_library_runs_the_gpt_as_pytorch_does(assembled):
    lib = assembled
    line = lib.line()
    assert ("chapter 01: your topological_order. chapter 02: your Mul, Sum, matmul_backward, log_softmax, "
            "cross_entropy, adam_step. chapter 06: your kernels blas_matmul, flat_map, flat_zip, strided_copy, "
            "strided_map, strided_zip, sum_columns, sum_dim; the course's kernels for reduce max, where. "
            "chapter 12: your Softmax, GELU, LayerNorm, Embedding, MaskedFill, CausalAttention, Block, GPT, "
            "param_groups, AdamW, lr_at, clip_grad_norm, save_checkpoint, load_checkpoint, train, generate.") in line
    for name in ("Softmax", "GELUTanh", "LayerNorm", "Embedding", "MaskedFill", "Mul", "Sum", "MatMul", "CrossEntropy"):
        assert meter.whose(lib.functions[name]) == "yours", name
    assert lib.GPT.GPT.__module__ == "course_yours_ch12"
    torch.manual_seed(0)
    theirs = TorchGPT(CONFIG).double()
    ours = lib.GPT.from_torch(theirs)
    idx, tgt = _batch(1), _batch(2)
    with lib.running():
        assert OPS.Softmax.__module__ == "course_yours_ch12" and OPS.Mul.__name__ == "MulOfYours"
        logits, loss = ours(idx, tgt)
        loss.backward()
    assert OPS.Softmax is functions.Softmax and OPS.MatMul is functions.MatMul     # only inside the block
    their_logits, their_loss = theirs(torch.from_numpy(idx), torch.from_numpy(tgt))
    their_loss.backward()
    np.testing.assert_allclose(logits.numpy(), their_logits.detach().numpy(), rtol=0, atol=1e-12)
    named = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), named[name].grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)


def test_the_learners_modules_are_not_written_into(assembled):
    """The assembly runs the learner's Mul on the backend's zip through a copy of its code (adapters.rebound):
    their chapter 02 module still names their own Python loops."""
    module = sys.modules["course_yours_ch02"]
    assert module.strided_zip.__module__ == "course_yours_ch02"
    assert module.strided_reduce.__module__ == "course_yours_ch02"
    assert "Value" not in vars(sys.modules["course_yours_ch12"]) or \
        vars(sys.modules["course_yours_ch12"])["Value"].__module__ != "course_lib.yours.adapters"


def test_a_step_runs_at_least_90_percent_of_its_calls_on_the_learners_code(assembled):
    lib = assembled
    torch.manual_seed(0)
    model = lib.GPT.from_torch(TorchGPT(CONFIG).double())
    optimizer = lib.configure_optimizer(model, TrainConfig())
    measured = meter.measure_step(lib, model, optimizer, _batch(3), _batch(4))
    calls, _ = measured["meter"].total()
    mine, _ = measured["meter"].total("yours")
    assert mine >= 0.9 * calls, meter.describe(measured)
    ran = {name for whose, name in measured["meter"].calls if whose == "yours"}
    assert {"flat_zip", "flat_map", "blas_matmul", "sum_columns", "sum_dim", "strided_copy",       # chapter 06
            "matmul_backward", "log_softmax", "cross_entropy", "adam_step",                     # chapter 02
            "topological_order",                                                                # chapter 01
            "Embedding.forward", "Embedding.backward"} <= ran, ran                              # chapter 12
    theirs = {name for whose, name in measured["meter"].calls if whose == "course"}
    assert theirs <= {"reduce max", "where"}, theirs
    nodes = {name for whose, name in measured["meter"].nodes if whose == "yours"}
    assert nodes == {"MatMul", "CausalAttention", "GELU", "LayerNorm", "Embedding", "CrossEntropy"}, nodes
    lines = meter.describe(measured)
    assert lines[0].startswith("one training step:") and "ran your code" in lines[0]


def test_the_learners_loop_follows_chapter_04s_and_resumes_exactly(assembled, tmp_path):
    lib = assembled
    tokens = np.random.default_rng(3).integers(0, CONFIG.vocab_size, 400)
    cfg = TrainConfig(max_iters=6, batch_size=3, lr=1e-3, warmup_iters=2, lr_decay_iters=6, eval_interval=3,
                      eval_iters=1)
    torch.manual_seed(0)
    theirs = TorchGPT(CONFIG).double()
    ours = lib.GPT.from_torch(theirs)
    start = ours.state_dict()
    batches = Batches(tokens, 12, 3, seed=5)
    want = trainer.train(theirs, lambda s: tuple(map(torch.from_numpy, batches.get(s))), cfg, progress=False)
    with lib.running():
        got = lib.train(ours, lib.configure_optimizer(ours, cfg), Batches(tokens, 12, 3, seed=5), cfg)
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=0, atol=1e-9)
        np.testing.assert_allclose(got["val_loss"], want["val_loss"], rtol=0, atol=1e-9)
        path = str(tmp_path / "run.ckpt")
        first = lib.GPT(CONFIG, np.float64)
        first.load_state_dict(start)
        lib.train(first, lib.configure_optimizer(first, cfg), Batches(tokens, 12, 3, seed=5),
                  TrainConfig(**{**cfg.__dict__, "max_iters": 4}), checkpoint=path, save_every=2)
        later = lib.GPT(CONFIG, np.float64)
        rest = lib.train(later, lib.configure_optimizer(later, cfg), Batches(tokens, 12, 3, seed=8), cfg,
                         checkpoint=path, resume=True)
        written = lib.generate(later, _batch(6, (2, 3)), 14, 0.9, 5, lambda p: p.argmax(-1))
    assert rest["loss"] == got["loss"][4:]
    assert all(np.array_equal(p.numpy(), q.numpy()) for p, q in zip(ours.parameters(), later.parameters()))
    assert written.shape == (2, 17)


def test_a_wrong_piece_stops_the_assembly_named_and_the_switch_gives_the_courses(learner, capsys):
    carried.break_piece("12", "embedding_function", "np.add.at(d_weight, ctx.idx.reshape(-1), grad.data.to_numpy()"
                        ".reshape(-1, D))", "d_weight[ctx.idx.reshape(-1)] += grad.data.to_numpy().reshape(-1, D)")
    with pytest.raises(CheckFailed, match="your saved `embedding_function` .Embedding.") as failure:
        capstone.assemble()
    assert "write each row once" in str(failure.value)
    with carried.switched_off("12"):
        lib = capstone.assemble()
    assert lib.functions["Embedding"] is capstone.COURSE_12["Embedding"]
    assert ("chapter 12: the course's Softmax, GELU, LayerNorm, Embedding, MaskedFill, CausalAttention, Block, GPT, "
            "param_groups, AdamW, lr_at, clip_grad_norm, save_checkpoint, load_checkpoint, train, generate"
            in capsys.readouterr().out)


def test_a_mul_that_skips_the_named_loop_falls_back_to_the_courses(learner, capsys):
    """The exercise asks Mul.forward to compute with strided_zip; one that runs a loop of its own would run a
    Python loop per element under the GPT, so the course's Mul runs it, and the line says so."""
    for exercise in ("mul_function", "tensor_methods"):    # the Tensor's section saved Mul again, as it uses it
        carried.break_piece("02", exercise, "return strided_zip(operator.mul, a.data, b.data)",
                            "return TensorData.from_numpy(a.numpy() * b.numpy(), np.result_type(a.dtype, b.dtype))")
    lib = capstone.assemble()
    assert lib.functions["Mul"] is functions.Mul
    assert "chapter 02: your Sum, matmul_backward, log_softmax, cross_entropy, adam_step; the course's Mul" in \
        capsys.readouterr().out


def test_nothing_saved_runs_the_courses_pieces_equal_to_pytorch(workspace, capsys):
    lib = capstone.assemble()
    out = capsys.readouterr().out
    assert "chapter 01: the course's topological_order" in out and "chapter 12: the course's Softmax" in out
    assert all(meter.whose(f) == "course" for name, f in lib.functions.items() if name != "topological_order")
    torch.manual_seed(1)
    theirs = TorchGPT(CONFIG).double()
    ours = lib.GPT.from_torch(theirs)
    idx = _batch(4, (3, 12))
    with lib.running():
        logits, _ = ours(idx)
    np.testing.assert_allclose(logits.numpy(), theirs(torch.from_numpy(idx))[0].detach().numpy(), atol=1e-12)


def test_the_payoff_stops_at_once_on_a_wrong_piece(learner):
    carried.break_piece("12", "generate", "idx[:, -model.config.block_size:]", "idx")     # no crop to block_size
    assert "block_size" in carried.assert_payoff_stops_at_once("12", learner, "generate")
