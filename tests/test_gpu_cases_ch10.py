"""benchmarks/gpu_cases_ch10.py works on the simulator: its cases pass on the course's kernels and fail on
wrong ones, and its figures fill a row each, with the goal column saying the simulator is not judged.

On a GPU the same file gives chapter 10's figures in gpu_verify.py's one call; here the sizes are tiny.
"""

import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_cases  # noqa: E402
import gpu_cases_ch10  # noqa: E402
import gpu_verify  # noqa: E402


def env():
    return gpu_cases.Env(True, gpu_verify.Budget(None))


def ours(table):
    return [entry for entry in table if entry[-1].__module__ == "gpu_cases_ch10"]


def run(name):
    fn = next(f for _, n, f in ours(gpu_cases.CASES) if n == name)
    return fn(env())


def test_the_cases_join_gpu_verify_and_pass_on_the_simulator():
    names = [n for _, n, _ in ours(gpu_cases.CASES)]
    mine = ("GPU forward causal Tq<Tk", "GPU forward full", "GPU backward causal Tq<Tk", "GPU forward", "GPU backward")
    assert set(mine) <= set(names)
    for name in mine:
        check = run(name)
        assert check.decide() == "PASS", (name, check)


def test_the_figures_fill_a_row_each_and_judge_no_goal_on_the_simulator(tmp_path):
    figures = ours(gpu_cases.FIGURES)
    assert {g for g, *_ in figures} == {"attention", "scan"}
    report = gpu_verify.Report(tmp_path / "r.md", {"date": "today", "device": "simulator"})
    gpu_verify.run_figures(figures, env(), report, 0.0)
    for fig in report.figures:
        assert len(fig.rows) == 1 and not any(n.startswith("FAILED") for n in fig.notes), fig
        row = dict(zip(fig.header, fig.rows[0]))
        assert row["goal fwd"] == row["goal fwd+bwd"] == "not judged (simulator)"
    text = (tmp_path / "r.md").read_text()
    assert "SDPA" in text and "chapter 05's loop" in text


def test_an_attention_forward_that_misses_the_last_key_fails(monkeypatch):
    real = gpu_cases_ch10.attention_gpu.forward

    def drops_the_last_key(q, k, v, causal=False, scale=None):
        return real(q, k[:, :, :-1], v[:, :, :-1], False, scale)

    monkeypatch.setattr(gpu_cases_ch10.attention_gpu, "forward", drops_the_last_key)
    check = run("GPU forward full")
    assert check.decide() == "FAIL" and "tightest: out" in check.note


def test_a_scan_forward_with_stale_checkpoints_fails(monkeypatch):
    real = gpu_cases_ch10.scan_gpu.scan_forward

    def stale(*args):
        y, h, ckpt = real(*args)
        return y, h, torch.zeros_like(ckpt)

    monkeypatch.setattr(gpu_cases_ch10.scan_gpu, "scan_forward", stale)
    check = run("GPU forward")
    assert check.decide() == "FAIL" and "checkpoints" in check.note
