"""The committed outputs do not depend on the CPU.

nbval compares a notebook's committed outputs with a fresh run on the learner's machine, and the last
bits of a float computation differ from one CPU to the next: PyTorch, numpy and the BLAS libraries pick
their kernels by instruction set (AVX-512, AVX2, SSE, NEON). So:

- every committed output that nbval compares is searched for rounding noise (a float printed with 14 or
  more significant digits, or a tiny error such as 2.7e-17): a notebook prints the bound an error meets
  (`course_lib.checks.below`) and few enough digits that noise cannot reach them;
- the notebooks that print the most computed figures run once more as another CPU computes them (the
  variables of `other_cpu()`), and nbval compares the fresh outputs with the committed ones;
- a notebook that prints noise is shown to fail that comparison, so the check is known to bite.
"""

import os
import platform
import re
import subprocess
import sys

import nbformat
import pytest

from course_lib import REPO_DIR
from course_lib.course import nbtools

SANITIZE = REPO_DIR / "tests" / "nbval_sanitize.cfg"
# Lessons and solved exercises that print the most computed figures and run quickly; the whole
# course's outputs are searched for noise below.
# Three run in `make test`; `make sweep` (--slow) adds three more.
RERUN = ["notebooks/01_autograd.ipynb", "notebooks/02_tensors.ipynb", "solutions/01_autograd.ipynb",
         *(pytest.param(path, marks=pytest.mark.slow) for path in
           ("notebooks/03_graph_mode.ipynb", "solutions/00_warmup.ipynb", "solutions/02_tensors.ipynb"))]

# 14+ significant digits (a float's full repr), or a tiny error with a fractional mantissa (7.5e-12).
NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d+(?:e[-+]?\d+)?")
TINY = re.compile(r"(?<![\w.])-?\d\.\d+e-(?:0?9|[1-9]\d)\b")


def other_cpu():
    """Environment variables under which this machine computes as a CPU with other kernels would:
    PyTorch's scalar kernels instead of its vectorized ones, numpy without its dispatched SIMD loops
    (AVX2, AVX-512 or their ARM counterparts), and, on x86, OpenBLAS's and MKL's SSE kernels."""
    from numpy._core._multiarray_umath import __cpu_dispatch__

    env = {"ATEN_CPU_CAPABILITY": "default", "NPY_DISABLE_CPU_FEATURES": " ".join(__cpu_dispatch__)}
    if platform.machine().lower() in ("x86_64", "amd64"):
        env |= {"OPENBLAS_CORETYPE": "Prescott", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
    return env


def significant_digits(number):
    mantissa = number.lstrip("-").split("e")[0].replace(".", "").lstrip("0")
    return len(mantissa)


def noise_in(text):
    """The first number in `text` that looks like rounding noise, or None."""
    if m := TINY.search(text):
        return m.group(0)
    return next((m.group(0) for m in NUMBER.finditer(text) if significant_digits(m.group(0)) >= 14), None)


def compared_outputs(path):
    """(cell index, text) of every code cell whose outputs nbval compares."""
    for i, cell in enumerate(nbtools.read(path).cells):
        tags = cell.metadata.get("tags", [])
        if cell.cell_type != "code" or {"nbval-ignore-output", "nbval-skip"} & set(tags) or "NBVAL_IGNORE_OUTPUT" in cell.source:
            continue
        yield i, "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in cell.outputs)


NOTEBOOKS = sorted(p.relative_to(REPO_DIR).as_posix() for folder in ("notebooks", "solutions")
                   for p in (REPO_DIR / folder).glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_no_committed_output_prints_rounding_noise(path):
    for i, text in compared_outputs(REPO_DIR / path):
        found = noise_in(text)
        assert found is None, (
            f"{path} cell {i} prints {found}, rounding noise that differs from one CPU to the next, in an output "
            "nbval compares. Print the bound it meets (course_lib.checks.below(err, 1e-12)) or fewer digits "
            "(see CONTRIBUTING.md, 'Printing figures that every CPU prints alike').")


def test_the_noise_search():
    assert noise_in("largest gradient difference: 2.7755575615628914e-17") == "2.7755575615628914e-17"
    assert noise_in("worst relative error 7.5e-12") == "7.5e-12"
    assert noise_in("loss: 1.2058441129606616") == "1.2058441129606616"
    for fine in ("below 1e-12", "loss 2.3026, accuracy 0.838", "x.grad = 22015.456049", "lr 3.0e-04",
                 "1797 digits", "[0.78728697 0.48069102]", "shape (4096, 12)"):
        assert noise_in(fine) is None, fine


def nbval(path, env, cwd):
    """Run nbval on one notebook from `cwd` (a workspace folder); returns (exit code, output)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--nbval",
           "--nbval-kernel-name", "python3", "--nbval-sanitize-with", str(SANITIZE), "--nbval-cell-timeout=300",
           str(path)]
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    return done.returncode, done.stdout + done.stderr


def staged(path, tmp_path):
    """A copy of the notebook placed as a learner's workspace holds it (solutions as exercises)."""
    kind = "exercises" if path.startswith("solutions/") else "notebooks"
    folder = tmp_path / "work" / kind
    folder.mkdir(parents=True)
    target = folder / path.split("/")[1]
    target.write_bytes((REPO_DIR / path).read_bytes())
    return target


@pytest.mark.parametrize("path", RERUN)
def test_outputs_are_the_same_on_another_cpu(path, tmp_path):
    target = staged(path, tmp_path)
    env = {**os.environ, **other_cpu(), "COURSE_WORKSPACE": str(tmp_path / "work")}
    code, out = nbval(target, env, target.parent)
    assert code == 0, (
        f"{path} prints other outputs when PyTorch, numpy and BLAS use other kernels ({other_cpu()}), as on "
        f"another learner's CPU: round what it prints (CONTRIBUTING.md). nbval said:\n{out[-4000:]}")


def test_the_rerun_catches_a_notebook_that_prints_noise(tmp_path):
    """A notebook that prints full-precision sums of vectorized kernels is committed with this machine's
    outputs; run as another CPU, nbval must report that they differ."""
    source = ("import numpy as np, torch\n"
              "x = np.random.default_rng(0).standard_normal(100_000)\n"
              "print(repr(float(np.tanh(x).sum())), repr(float(torch.tanh(torch.from_numpy(x)).sum())),\n"
              "      repr(float((x[:4096].reshape(64, 64) @ x[4096:8192].reshape(64, 64)).sum())))")
    probe = [sys.executable, "-c", source]
    same = subprocess.run(probe, capture_output=True, text=True).stdout == \
        subprocess.run(probe, capture_output=True, text=True, env={**os.environ, **other_cpu()}).stdout
    if same:
        pytest.skip("this CPU computes the probe alike with and without its vectorized kernels, so the rerun "
                    "cannot tell noise from a portable figure here")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    nb.metadata["kernelspec"] = dict(nbtools.KERNEL)
    path = tmp_path / "noise.ipynb"
    nbtools.write(nbtools.execute(nb, cwd=tmp_path), path)
    code, out = nbval(path, {**os.environ, **other_cpu()}, tmp_path)
    assert code != 0 and "outputs differ" in out, out[-3000:]
