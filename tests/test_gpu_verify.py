"""benchmarks/gpu_verify.py keeps working where no GPU is: its simulated run passes, without the lessons' packages.

The script is what runs the course's CUDA code on a real GPU, in one short call on a machine that has
no graphviz, nbformat or jupyter. So it runs here in a subprocess, under --simulate, with those
packages made unimportable; its cases are shown to fail on wrong kernels, a failing case is shown
not to stop the run, and the time budget is shown to skip figures, never the correctness cases.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_verify.py"
sys.path.insert(0, str(SCRIPT.parent))

import gpu_cases  # noqa: E402
import gpu_verify  # noqa: E402

# Not installed on the GPU machine the script is written for; the lessons need them, the script must not.
ABSENT = ("graphviz", "nbformat", "nbclient", "jupyter_client", "jupyterlab", "ipywidgets", "ipykernel",
          "IPython", "micrograd", "nbval")


GPU_ONLY = ("The matmul ladder against cuBLAS (float32, TF32 off)",)


def run_script(tmp_path, *args, timeout=300):
    """The script in a fresh interpreter on the simulator, with ABSENT made unimportable."""
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in ABSENT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), str(REPO)]), "NUMBA_ENABLE_CUDASIM": "1",
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), "--simulate", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_check_imports_prints_the_versions(capsys):
    assert gpu_verify.main(["--check-imports"]) == 0
    printed = capsys.readouterr().out
    for fact in ("imports: all fine", "numba-cuda:", "torch:", "python:", "nvcc:"):
        assert fact in printed, f"--check-imports does not print {fact!r}"


def test_simulated_run_passes_every_case_and_fills_every_figure(tmp_path):
    report = tmp_path / "report.md"
    out = run_script(tmp_path, "--out", str(report))
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert " 0 failed" in out.stdout and "imports: all fine" in out.stdout, log[-4000:]
    text = report.read_text()
    assert "Numba's CUDA simulator" in text and "numba-cuda" in text
    for group, name, _ in gpu_cases.CASES:
        line = next((ln for ln in text.splitlines() if ln.startswith(f"| {group} | {name} |")), None)
        assert line is not None, f"case {group}/{name} is missing from the report"
        status = line.split(" | ")[2]
        assert status in ("PASS", "SKIP", "INFO"), line
        if status == "SKIP":
            assert len(line.split(" | ")[5]) > 20, f"a skip must say why: {line}"
    for _, title, _, _ in gpu_cases.FIGURES:
        section = text.split(f"### {title}")[1].split("###")[0]
        rows = [ln for ln in section.splitlines() if ln.startswith("| ") and "---" not in ln]
        if title in GPU_ONLY:                    # timed only on a GPU: the report says so, with the reason
            assert "Not measured: needs a GPU" in section, section
            continue
        assert len(rows) >= 2, f"figure {title!r} has no row:\n{section}"      # the header and one row


# ---- the runner: failures are recorded and the run goes on; the budget skips figures only -------------

class FakeEnv:
    def __init__(self, seconds=None):
        self.budget = gpu_verify.Budget(seconds)


def test_a_failing_case_is_recorded_and_the_run_goes_on(tmp_path, capsys):
    def raises(env):
        raise ValueError("boom at index 3")

    def over_bound(env):
        return gpu_verify.Check(2e-3, 1e-4, "shape (5,)")

    def skips(env):
        raise gpu_verify.Skip("needs nvcc: none on PATH")

    def passes(env):
        return gpu_verify.Check(1e-7, 1e-6, "fine")

    report = gpu_verify.Report(tmp_path / "r.md", {"date": "today", "device": "test"})
    cases = [("limits", "raises", raises), ("limits", "over", over_bound), ("limits", "skips", skips),
             ("limits", "passes", passes)]
    gpu_verify.run_cases(cases, FakeEnv(), report, 0.0)
    assert [r.status for r in report.results] == ["FAIL", "FAIL", "SKIP", "PASS"]
    assert report.results[0].note == "ValueError: boom at index 3"
    assert report.counts()["FAIL"] == 2
    text = (tmp_path / "r.md").read_text()
    assert "| limits | raises | FAIL |" in text and "boom at index 3" in text and "needs nvcc" in text
    printed = capsys.readouterr().out
    assert "FAIL limits/over" in printed and "max err 2.0e-03  bound 1.0e-04" in printed


def test_main_exits_nonzero_when_a_case_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_cases, "CASES", [("limits", "broken", lambda env: gpu_verify.Check(1.0, 0.0))])
    monkeypatch.setattr(gpu_cases, "FIGURES", [])
    assert gpu_verify.main(["--only", "limits", "--out", str(tmp_path / "r.md")]) == 1
    monkeypatch.setattr(gpu_cases, "CASES", [("limits", "fine", lambda env: gpu_verify.Check(0.0, 0.0))])
    assert gpu_verify.main(["--only", "limits", "--out", str(tmp_path / "r.md")]) == 0


def test_time_budget_skips_the_figures_not_the_cases(tmp_path, capsys):
    assert gpu_verify.main(["--only", "matmul", "--time-budget", "0", "--out", str(tmp_path / "r.md")]) == 0
    printed = capsys.readouterr().out
    assert "PASS matmul/15 tiled" in printed and "PASS matmul/17 2D blocking" in printed
    assert "SKIP figure 'The matmul ladder against cuBLAS (float32, TF32 off)': time budget spent" in printed
    assert "Skipped (time budget spent): the whole figure" in (tmp_path / "r.md").read_text()


# ---- the cases catch wrong kernels ---------------------------------------------------------------------

def run_case(name, env):
    fn = next(f for _, n, f in gpu_cases.CASES if n == name)
    return fn(env)


@pytest.fixture
def env():
    from course_lib import device
    return gpu_cases.Env(device.using_simulator(), gpu_verify.Budget(None))


def pool3_without_halo(a):
    """Each block starts its window afresh: the usual missing halo."""
    out = a.copy()
    for s in range(0, a.size, gpu_cases.P.TPB):
        c = a[s:s + gpu_cases.P.TPB]
        out[s + 1:s + c.size] += c[:-1]
        out[s + 2:s + c.size] += c[:-2]
    return out


def matmul_without_last_tile(A, B, step, ladder):
    """The K loop stops at the last full tile of K (floor instead of ceil)."""
    tile = 8                                   # the simulator's tiles along K: 8 (tiled), 4 (1D), 8 (2D)
    k = A.shape[1] // tile * tile
    return (A[:, :k] @ B[:k]).astype(np.float32)


def test_wrong_puzzles_and_matmul_fail(env, monkeypatch):
    monkeypatch.setattr(gpu_cases.P, "pool3", pool3_without_halo)
    check = run_case("09 pool3", env)
    assert check.decide() == "FAIL" and check.err > check.bound
    monkeypatch.setattr(gpu_cases.M, "matmul", matmul_without_last_tile)
    for step in ("15 tiled", "17 2D blocking"):
        assert run_case(step, env).decide() == "FAIL"


def test_a_scan_without_its_skip_term_fails(env, monkeypatch):
    real = gpu_cases.scan_cuda.scan_forward

    def no_skip(x, delta, A, B, C, D, chunk):          # y_t = C_t . h_t, forgetting + D x_t
        y, h, ckpt = real(x, delta, A, B, C, D, chunk)
        return y - x * D, h, ckpt

    monkeypatch.setattr(gpu_cases.scan_cuda, "scan_forward", no_skip)
    check = run_case("fused forward + backward", env)
    assert check.decide() == "FAIL" and "tightest: y" in check.note


def test_attention_with_the_causal_mask_off_by_one_fails(env, monkeypatch):
    real = gpu_cases.attention_cuda.forward

    def one_key_too_many(q, k, v, causal=False, scale=None):
        out, lse = real(q, k, v, causal, scale)
        Tq, Tk = q.shape[2], k.shape[2]
        mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq + 1)
        wrong = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return wrong, lse

    monkeypatch.setattr(gpu_cases.attention_cuda, "forward", one_key_too_many)
    check = run_case("fused fwd+bwd causal", env)
    assert check.decide() == "FAIL" and "tightest: out" in check.note


def test_a_launcher_without_the_gpu_limits_fails(env, monkeypatch):
    monkeypatch.setattr(gpu_cases, "launch", lambda *a, **k: None)     # accepts anything, like the simulator
    assert run_case("course launch() refuses both", env).decide() == "FAIL"


def test_no_course_kernel_sizes_an_array_with_an_expression():
    """A GPU compiles shared and local arrays with constant sizes; the simulator does not check."""
    from numba import float32, float64

    from course_lib.cuda import backend, matmul, puzzles, scan
    from course_lib.cuda.launch import _non_constant_sizes
    from course_lib.custom_ops import numba_cuda
    from course_lib.fused import attention_cuda, scan_cuda

    kernels = [getattr(m, n) for m in (puzzles, matmul, scan, numba_cuda, scan_cuda) for n in dir(m)
               if hasattr(getattr(m, n), "py_func")]
    kernels += [*attention_cuda.kernels(float32), *attention_cuda.kernels(float64),
                backend._matmul_kernel(float32, *backend.SMALL), *backend._map_kernels(lambda x: x),
                *(k for k, _, _ in matmul.small_ladder().values())]
    assert len(kernels) > 20
    for k in kernels:
        assert _non_constant_sizes(k.py_func) == (), k.py_func.__name__


def _toolkit_missing():
    """Why gpu_compile_only.py cannot run here, or "" when the CUDA toolkit's compilers are all present."""
    import ctypes
    import shutil

    if not (shutil.which("ptxas") or Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "ptxas").exists()):
        return "no ptxas"
    for lib in ("libnvrtc.so.13", "libnvrtc.so.12"):
        try:
            ctypes.CDLL(lib)
            return ""
        except OSError:
            pass
    return "no libnvrtc on the library path"


def test_every_puzzle_compiles_for_a_gpu_without_one():
    """The compile-only check (numba's real CUDA target, NVVM and ptxas, no driver) where the toolkit is installed."""
    missing = _toolkit_missing()
    if missing:
        pytest.skip(f"benchmarks/gpu_compile_only.py needs the CUDA toolkit's compilers: {missing}")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    out = subprocess.run([sys.executable, str(SCRIPT.parent / "gpu_compile_only.py"), "--only", "puzzles,matmul"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "0 refused" in out.stdout and "ok: k_pool3" in out.stdout
    assert "ok: blocked_2d_kernel.<locals>.k_matmul_2d" in out.stdout


def test_the_runner_and_the_cases_do_not_import_each_other():
    """gpu_verify imports gpu_cases, and both import gpu_report; nothing imports gpu_verify (no loop)."""
    import ast

    for name in ("gpu_cases.py", "gpu_report.py", "gpu_compile_only.py", "ch07_matmul_gpu.py"):
        tree = ast.parse((SCRIPT.parent / name).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert "gpu_verify" not in imported, f"{name} imports gpu_verify"
    report = ast.parse((SCRIPT.parent / "gpu_report.py").read_text())
    assert not {n.module for n in ast.walk(report) if isinstance(n, ast.ImportFrom)} & {"gpu_cases", "course_lib"}
