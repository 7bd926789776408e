"""Chapter 10 carried forward: the learner's saved kernels run chapter 05's Mamba and chapter 04's GPT.

The reference answers are saved as a learner's (the solved notebook run from a workspace's exercises/),
then the payoff cells run on them: the Mamba's scan is their fused_scan, the GPT's attention is their op
around their flash_forward and flash_backward. A wrong saved kernel stops the payoff at once, named;
the switch, or nothing saved, gives the course's kernels.
"""

import carried
import numpy as np
import pytest
import torch

from course_lib import yours
from course_lib.checks import CheckFailed
from course_lib.fused import attention_cpu, scan_cpu
from course_lib.gpt.model import GPT, GPTConfig
from course_lib.mamba import Mamba, MambaConfig
from course_lib.yours import fused

saved, learner = carried.fixtures("10")   # the reference answers saved as a learner's; a copy per test


def test_the_payoff_trains_both_models_on_the_learners_kernels(saved, monkeypatch):
    monkeypatch.setenv("COURSE_WORKSPACE", str(saved))
    namespace, text = carried.run_payoff("10")
    assert ("chapter 10: your fused_scan, flash_forward, flash_backward, register_flash_attention; "
            "nothing of the course's") in text
    lines = {line.split(",")[0]: line for line in text.splitlines()}
    for model in ("Mamba", "GPT"):
        assert "yours equal within 1e-4: True; weights after the step equal within 1e-5: True" in lines[model], text
    kernels = namespace["kernels"]
    assert {getattr(f, "py_func", f).__module__ for f in kernels.pieces.values()} == {"course_yours_ch10"}
    assert "(yours)" in text and "(the scores in memory)" in text       # the memory cell ran on their kernel


def test_the_models_call_the_learners_kernels_forward_and_backward(learner, monkeypatch):
    calls, pieces = [], yours.pieces

    def counted(*args, **kwargs):
        chosen = pieces(*args, **kwargs)
        for name in ("fused_scan", "flash_forward", "flash_backward"):
            kernel = chosen[name]
            chosen[name] = lambda *a, kernel=kernel, name=name: calls.append(name) or kernel(*a)
        return chosen

    monkeypatch.setattr(yours, "pieces", counted)
    kernels = fused.assemble(quiet=True)
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=19, block_size=9, n_layer=2, n_head=2, n_embd=8, fused=True))
    mamba = Mamba(MambaConfig(vocab_size=19, d_model=8, n_layer=2, d_state=4, scan="fused"))
    idx = torch.randint(0, 19, (2, 9))
    with kernels.running():
        gpt(idx, idx)[1].backward()
        mamba(idx, targets=idx)[1].backward()
    assert sorted(calls) == ["flash_backward"] * 2 + ["flash_forward"] * 2 + ["fused_scan"] * 2   # 2 layers each
    assert all(p.grad is not None for p in list(gpt.parameters()) + list(mamba.parameters()))
    with torch.no_grad(), pytest.raises(RuntimeError, match="attention_kernel"):
        gpt(idx)                                               # outside the block: no fused kernel at all
    assert calls.count("flash_forward") == 2


def test_the_gpt_on_the_learners_op_equals_sdpa(learner):
    kernels = fused.assemble(quiet=True)
    q, k, v = (torch.randn(2, 3, 21, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    ours = kernels.attention(q, k, v)
    theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    dout = torch.randn_like(ours)
    for mine, ref in zip(torch.autograd.grad(ours, (q, k, v), dout), torch.autograd.grad(theirs, (q, k, v), dout)):
        torch.testing.assert_close(mine, ref, rtol=1e-10, atol=1e-10)


def test_a_wrong_kernel_stops_the_payoff_at_once_named(learner):
    carried.break_piece("10", "fused_scan", "y_t = D[d] * x[b, t, d]", "y_t = x.dtype.type(0)")   # the skip dropped
    namespace = {}
    with pytest.raises(CheckFailed, match="your saved `fused_scan`") as failure:
        carried.run_payoff("10", namespace)
    assert "the D skip is missing" in str(failure.value)        # the check says which mistake it is
    assert "kernels" not in namespace                           # stopped in the first cell, before any model ran


def test_switched_off_or_nothing_saved_the_courses_kernels_run(learner, tmp_path, monkeypatch, capsys):
    with carried.switched_off("10"):
        kernels = fused.assemble()
    assert kernels.pieces == fused.COURSE
    assert "the course's fused_scan, flash_forward, flash_backward, register_flash_attention" in capsys.readouterr().out
    monkeypatch.setenv("COURSE_WORKSPACE", str(tmp_path / "empty"))
    kernels = fused.assemble(quiet=True)
    assert kernels.pieces["flash_forward"] is attention_cpu.forward_kernel
    assert kernels.pieces["fused_scan"] is scan_cpu.scan_forward
    args = [torch.randn(1, 7, 3, dtype=torch.float64), torch.rand(1, 7, 3, dtype=torch.float64),
            -torch.rand(3, 2, dtype=torch.float64), torch.randn(1, 7, 2, dtype=torch.float64),
            torch.randn(1, 7, 2, dtype=torch.float64), torch.randn(3, dtype=torch.float64)]
    from course_lib.mamba.scan import selective_scan_sequential

    np.testing.assert_allclose(kernels.scan(*args).numpy(), selective_scan_sequential(*args).numpy(), rtol=1e-10)
