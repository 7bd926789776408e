"""Chapter 12 carried forward: with the reference answers of chapters 01, 02, 06 and 12 saved as a learner's,
chapter 04's GPT runs on the learner's library (their Functions through the op registry, their chapter 06
kernels as the backend, their topological order walking the backward, their adam_step updating) and equals
PyTorch's in logits, gradients and losses; at least 90% of a step's computing calls run their code; a wrong
saved piece stops the assembly and the payoff at once, named; with nothing saved, or switched off, the
course's pieces run."""

import shutil

import carried
import numpy as np
import pytest
import torch

from course_lib.capstone import compare_training
from course_lib.checks import CheckFailed
from course_lib.gpt.model import GPT as TorchGPT
from course_lib.gpt.model import GPTConfig
from course_lib.gpt.trainer import TrainConfig
from course_lib.tensor import OPS, functions
from course_lib.yours import ch12_capstone as capstone

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
            "chapter 12: your Softmax, GELU, LayerNorm, Embedding, MaskedFill, causal_self_attention.") in line
    for name in ("Mul", "Sum", "Softmax", "GELUTanh", "LayerNorm", "Embedding", "MaskedFill", "MatMul", "CrossEntropy"):
        assert lib.functions[name].whose == "yours", name
    torch.manual_seed(0)
    theirs = TorchGPT(CONFIG).double()
    ours = lib.GPT.from_torch(theirs)
    idx, tgt = _batch(1), _batch(2)
    with lib.running():
        assert OPS.Softmax.inner.__module__ == "course_yours_ch12" and OPS.Mul.inner.__module__ == "course_yours_ch02"
        logits, loss = ours(idx, tgt)
        loss.backward()
    assert OPS.Softmax is functions.Softmax and OPS.MatMul is functions.MatMul     # only inside the block
    their_logits, their_loss = theirs(torch.from_numpy(idx), torch.from_numpy(tgt))
    their_loss.backward()
    np.testing.assert_allclose(logits.numpy(), their_logits.detach().numpy(), rtol=0, atol=1e-12)
    named = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), named[name].grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)


def test_a_step_runs_at_least_90_percent_of_its_calls_on_the_learners_code(assembled):
    lib = assembled
    torch.manual_seed(0)
    model = lib.GPT.from_torch(TorchGPT(CONFIG).double())
    optimizer = lib.configure_optimizer(model, TrainConfig())
    measured = capstone.measure_step(lib, model, optimizer, _batch(3), _batch(4))
    meter = measured["meter"]
    calls, _ = meter.total()
    mine, _ = meter.total("yours")
    assert mine >= 0.9 * calls, capstone.describe_step(measured)
    ran = {name for whose, name in meter.calls if whose == "yours"}
    assert {"flat_zip", "flat_map", "blas_matmul", "sum_columns", "sum_dim", "strided_copy",       # chapter 06
            "matmul_backward", "log_softmax", "cross_entropy", "adam_step",                     # chapter 02
            "topological_order",                                                                # chapter 01
            "Embedding.forward", "Embedding.backward"} <= ran, ran                              # chapter 12
    theirs = {name for whose, name in meter.calls if whose == "course"}
    assert theirs <= {"reduce max", "where"}, theirs
    graph = measured["graph"]
    assert {name for whose, name in graph if whose == "yours"} == {
        "Mul", "MatMul", "Softmax", "GELU", "LayerNorm", "Embedding", "MaskedFill", "CrossEntropy"}
    lines = capstone.describe_step(measured)
    assert lines[0].startswith("one training step:") and "ran your code" in lines[0]


def test_training_on_the_learners_library_follows_pytorchs_losses(assembled):
    lib = assembled
    tokens = np.random.default_rng(3).integers(0, CONFIG.vocab_size, 400)
    with lib.running():
        theirs, ours = compare_training(CONFIG, TrainConfig(batch_size=3, lr=1e-3, warmup_iters=2), tokens, 5,
                                        gpt=lib.GPT, make_optimizer=lib.configure_optimizer)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)


def test_a_wrong_piece_stops_the_assembly_named_and_the_switch_gives_the_courses(learner, capsys):
    carried.break_piece("12", "embedding_function", "np.add.at(d_weight, ctx.idx.reshape(-1), grad.data.to_numpy()"
                        ".reshape(-1, D))", "d_weight[ctx.idx.reshape(-1)] += grad.data.to_numpy().reshape(-1, D)")
    with pytest.raises(CheckFailed, match="your saved `embedding_function` .Embedding.") as failure:
        capstone.assemble()
    assert "write each row once" in str(failure.value)
    with carried.switched_off("12"):
        lib = capstone.assemble()
    assert lib.functions["Embedding"].inner is functions.Embedding and lib.functions["Embedding"].whose == "course"
    assert ("chapter 12: the course's Softmax, GELU, LayerNorm, Embedding, MaskedFill, causal_self_attention"
            in capsys.readouterr().out)


def test_a_mul_that_skips_the_named_loop_falls_back_to_the_courses(learner, capsys):
    """The exercise asks Mul.forward to compute with strided_zip; one that runs a loop of its own would run a
    Python loop per element under the GPT, so the course's Mul runs it, and the line says so."""
    for exercise in ("mul_function", "tensor_methods"):    # the Tensor's section saved Mul again, as it uses it
        carried.break_piece("02", exercise, "return strided_zip(operator.mul, a.data, b.data)",
                            "return TensorData.from_numpy(a.numpy() * b.numpy(), np.result_type(a.dtype, b.dtype))")
    lib = capstone.assemble()
    assert lib.functions["Mul"].inner is functions.Mul
    assert "chapter 02: your Sum, matmul_backward, log_softmax, cross_entropy, adam_step; the course's Mul" in \
        capsys.readouterr().out


def test_nothing_saved_runs_the_courses_pieces_equal_to_pytorch(workspace, capsys):
    lib = capstone.assemble()
    assert "chapter 01: the course's topological_order" in capsys.readouterr().out
    assert all(getattr(f, "whose", "course") == "course" for f in lib.functions.values())
    torch.manual_seed(1)
    theirs = TorchGPT(CONFIG).double()
    ours = lib.GPT.from_torch(theirs)
    idx = _batch(4, (3, 12))
    with lib.running():
        logits, _ = ours(idx)
    np.testing.assert_allclose(logits.numpy(), theirs(torch.from_numpy(idx))[0].detach().numpy(), atol=1e-12)


def test_the_payoff_stops_at_once_on_a_wrong_piece(learner):
    carried.break_piece("12", "causal_self_attention", "k=1", "k=0")   # hides the diagonal too
    assert "hides the diagonal" in carried.assert_payoff_stops_at_once("12", learner, "causal_self_attention")
