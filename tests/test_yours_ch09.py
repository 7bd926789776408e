"""Chapter 09's carried-forward engine: the learner's saved pieces run the exported MLP (and GPT) exactly
as onnxruntime does, a wrong saved piece stops the build with its check's message, and the switch
gives the course's engine."""

import functools

import carried
import numpy as np
import onnxruntime as ort
import pytest
import torch

from course_lib.checks import CheckFailed
from course_lib.infer.models import MLP, course_gpt, export
from course_lib.infer.ops import linalg
from course_lib.infer.registry import lookup
from course_lib.yours.infer import REFERENCE, Engine

saved, learner = carried.fixtures("09")   # the reference answers saved as a learner's; a copy per test


@pytest.fixture(scope="module")
def mlp_onx():
    torch.manual_seed(0)
    return export(MLP(), torch.randn(2, 64), ["x"], ["logits"], {"x": {0: "batch"}})


def counting(fn, calls):
    @functools.wraps(fn)  # same signature, so the registry passes the same attributes
    def wrapped(*args, **kwargs):
        calls.append(fn)
        return fn(*args, **kwargs)
    return wrapped


def test_the_learners_pieces_run_the_mlp_as_onnxruntime_does(learner, mlp_onx, capsys):
    engine = Engine(mlp_onx)
    assert "chapter 09: your execute, gemm, softmax, reshape, fold_constants, fuse_matmul_add" in capsys.readouterr().out
    assert all(f.__module__ == "course_yours_ch09" for f in engine.pieces.values()), engine.pieces
    calls = []
    engine.pieces["execute"] = counting(engine.pieces["execute"], calls)
    engine.pieces["gemm"] = counting(engine.pieces["gemm"], calls)
    reference = ort.InferenceSession(mlp_onx, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for batch in (1, 5, 33):
        x = rng.standard_normal((batch, 64)).astype(np.float32)
        ours, = engine.run(None, {"x": x})
        theirs, = reference.run(None, {"x": x})
        assert ours.shape == theirs.shape == (batch, 10) and ours.dtype == np.float32
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    # each run went through the learner's executor and the learner's gemm, once per Gemm node (3)
    assert len(calls) == 3 * 4
    assert lookup("Gemm", 17)[0] is linalg.gemm  # the registry is the course's again after a run


def test_the_learners_pieces_run_the_gpt(learner):
    gpt = course_gpt(vocab_size=65, block_size=16, n_layer=1, n_head=2, n_embd=32)
    onx = export(gpt, torch.zeros(2, 16, dtype=torch.long), ["idx"], ["logits"], {"idx": {0: "batch", 1: "time"}})
    idx = np.random.default_rng(1).integers(0, 65, (2, 11)).astype(np.int64)
    engine = Engine(onx, input_shapes={"idx": idx.shape})
    ops = [n.op_type for n in engine.graph.nodes]
    assert ops.count("MatMulAdd") == 4 and "Softmax" in ops and "Reshape" in ops
    calls = []
    for name in ("softmax", "reshape"):
        engine.pieces[name] = counting(engine.pieces[name], calls)
    theirs, = ort.InferenceSession(onx, providers=["CPUExecutionProvider"]).run(None, {"idx": idx})
    np.testing.assert_allclose(engine.run(None, {"idx": idx})[0], theirs, rtol=1e-4, atol=1e-5)
    assert len(calls) == ops.count("Softmax") + ops.count("Reshape")  # the learner's kernels ran them


def test_a_wrong_piece_stops_the_build_named_and_the_switch_gives_the_courses(learner, mlp_onx, capsys):
    carried.break_piece("09", "gemm", "b = b.T if transB else b", "b = b")  # ignores transB
    with pytest.raises(CheckFailed, match="your saved `gemm`") as failure:
        Engine(mlp_onx)
    assert "transB" in str(failure.value)
    with carried.switched_off("09"):
        engine = Engine(mlp_onx)
    assert engine.pieces == REFERENCE
    assert "the course's execute, gemm, softmax, reshape, fold_constants, fuse_matmul_add" in capsys.readouterr().out
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    theirs, = ort.InferenceSession(mlp_onx, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(engine.run(None, {"x": x})[0], theirs, rtol=1e-5, atol=1e-5)


def test_nothing_saved_runs_the_courses(workspace, mlp_onx, capsys):
    engine = Engine(mlp_onx)
    assert engine.pieces == REFERENCE
    assert "chapter 09: none of your code saved yet" in capsys.readouterr().out


def test_the_payoff_cells_run_on_the_saved_pieces_and_stop_at_a_wrong_one(learner):
    text, errors = carried.payoff_on_a_kernel("09", learner)
    assert not errors, errors
    assert "chapter 09: your execute" in text and "equal within float32 tolerance" in text
    assert "equal onnxruntime's within float32 tolerance: True" in text

    carried.break_piece("09", "softmax", "x - x.max(axis=axis, keepdims=True)", "x")  # no max shift: overflows
    text, errors = carried.payoff_on_a_kernel("09", learner)
    (cell, error), *_ = errors
    assert cell == 0 and error.ename == "CheckFailed" and "your saved `softmax`" in error.evalue, error.evalue
    assert "max |your engine" not in text
