"""The committed outputs do not depend on the machine.

nbval compares a notebook's committed outputs with a fresh run on the learner's machine, which differs
from the one that recorded them in three ways a printed line can show:

- its CPU's kernels: the last bits of a float computation differ from one CPU to the next, because
  PyTorch, numpy and the BLAS libraries pick their kernels by instruction set (AVX-512, AVX2, SSE, NEON);
- its core count: Numba's and PyTorch's thread pools have one thread per core, so a printed thread count
  differs, and so does a parallel sum that depends on how its loop was split;
- the machine itself: its paths, host name, CPU model, operating system, Python build, GPU or not.

So:

- every committed output that nbval compares is searched for rounding noise (a float printed with 14 or
  more significant digits, or a tiny error such as 2.7e-17): a notebook prints the bound an error meets
  (`course_lib.checks.below`) and few enough digits that noise cannot reach them;
- and for what names the machine (`names_the_machine`: a thread or core count, a home folder or a
  checkout's path, a CPU, OS or device name, and this machine's own values); no committed output at all,
  compared or not, shows the path of the checkout or home folder it was recorded in (the book shows them);
- notebooks run once more as another machine computes them (`other_machine`: another CPU's kernels,
  another Numba thread count, PyTorch's threads left at their default), and nbval compares the fresh
  outputs with the committed ones: two in `make test`, every lesson and solution under `make sweep`;
- a notebook that prints noise or a thread count is shown to fail that comparison, so the check bites.
"""

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_lib import REPO_DIR
from course_lib.course import nbtools

SANITIZE = REPO_DIR / "tests" / "nbval_sanitize.cfg"

NOTEBOOKS = sorted(p.relative_to(REPO_DIR).as_posix() for folder in ("notebooks", "solutions")
                   for p in (REPO_DIR / folder).glob("[0-9][0-9]_*.ipynb"))

# The reruns. Numba's thread count is set above this machine's (2 cores) and below it; `make test` reruns a
# lesson that prints many computed figures, and the lesson of parallel loops, with one thread. `make sweep`
# reruns every lesson and solved exercise under both counts.
THREADS = ("4", "1")
IN_MAKE_TEST = {("notebooks/02_tensors.ipynb", "4"), ("notebooks/06_numba_cpu.ipynb", "1")}
RERUN = [pytest.param(path, threads, id=f"{path}-{threads}threads",
                      marks=() if (path, threads) in IN_MAKE_TEST else pytest.mark.slow)
         for path in NOTEBOOKS for threads in THREADS]

# 14+ significant digits (a float's full repr), or a tiny error with a fractional mantissa (7.5e-12).
NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d+(?:e[-+]?\d+)?")
TINY = re.compile(r"(?<![\w.])-?\d\.\d+e-(?:0?9|[1-9]\d)\b")

# What names the machine in a printed line, whichever machine recorded it. (A CUDA block's "256 threads"
# is the program's, not the machine's, so a count is caught only as "threads: 2" or "2 cores".)
MACHINE = re.compile("|".join([
    r"(?<![\w/-])(?:threads?|cores?|cpus?|workers?)\s*[:=]\s*\d+",           # threads: 2 (not regs/thread: 8)
    r"\b\d+\s+(?:(?:logical|physical|cpu)\s+)?(?:cores?|cpus?)\b",            # 2 cores
    r"(?:num_threads|cpu_count|NUM_THREADS)\b",
    r"(?<![\w.~])/(?:root|home/[^/\s]+|Users/[^/\s]+|tmp|private/var|var/folders)(?=/|\s|$)",   # a home or temp folder
    r"(?<![\w.~])/\S*/course_lib/",                                           # the library inside a checkout
    r"\b[A-Za-z]:\\\w",                                                      # C:\Users
    r"\b(?:x86_64|aarch64|arm64|AMD64|i[3-9]-\d{3,}|EPYC|Xeon|Ryzen|Core\(TM\)|Apple M\d)\b",
    r"\b(?:Linux|Darwin|Windows)-\d",                                         # platform.platform()
    r"\bPython \d\.\d+\.\d+|\bGCC \d+\.\d+|\bclang \d+",                      # sys.version
    r"\bGPU found\b|\bno GPU\b|\bNVIDIA\b|\bGeForce\b|\bcuda:\d\b",           # the device
]))


def this_machine():
    """Values only this machine has, as printed: its checkout, home and environment paths, host name, CPU."""
    values = {str(REPO_DIR), str(Path.home()), sys.prefix, platform.node(), platform.processor()}
    try:
        cpu = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
        values.add(cpu.split(":", 1)[1].strip())
    except (OSError, StopIteration):
        pass
    return sorted(v for v in values if len(v) >= 4 and v != "/")


def names_the_machine(text, mine=()):
    """The first thing in `text` that names the machine it ran on, or None."""
    if m := MACHINE.search(text):
        return m.group(0)
    return next((v for v in mine if re.search(rf"(?<![\w/]){re.escape(v)}(?![\w])", text)), None)


def other_cpu():
    """Environment variables under which this machine computes as a CPU with other kernels would:
    PyTorch's scalar kernels instead of its vectorized ones, numpy without its dispatched SIMD loops
    (AVX2, AVX-512 or their ARM counterparts), and, on x86, OpenBLAS's and MKL's SSE kernels."""
    from numpy._core._multiarray_umath import __cpu_dispatch__

    env = {"ATEN_CPU_CAPABILITY": "default", "NPY_DISABLE_CPU_FEATURES": " ".join(__cpu_dispatch__)}
    if platform.machine().lower() in ("x86_64", "amd64"):
        env |= {"OPENBLAS_CORETYPE": "Prescott", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
    return env


# `make test` pins these to one thread; a learner's machine leaves them at their default (one per core).
PINNED_THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def other_machine(threads):
    """The environment of a run as another learner's machine computes: another CPU's kernels, `threads`
    Numba threads, and PyTorch's and BLAS's threads at their default."""
    env = {k: v for k, v in os.environ.items() if k not in PINNED_THREADS}
    return env | other_cpu() | {"NUMBA_NUM_THREADS": threads}


def significant_digits(number):
    mantissa = number.lstrip("-").split("e")[0].replace(".", "").lstrip("0")
    return len(mantissa)


def noise_in(text):
    """The first number in `text` that looks like rounding noise, or None."""
    if m := TINY.search(text):
        return m.group(0)
    return next((m.group(0) for m in NUMBER.finditer(text) if significant_digits(m.group(0)) >= 14), None)


def output_text(output):
    return output.get("text", "") or output.get("data", {}).get("text/plain", "") or "\n".join(output.get("traceback", []))


def compared_outputs(path):
    """(cell index, text) of every code cell whose outputs nbval compares."""
    for i, cell in enumerate(nbtools.read(path).cells):
        tags = cell.metadata.get("tags", [])
        if cell.cell_type != "code" or {"nbval-ignore-output", "nbval-skip"} & set(tags) or "NBVAL_IGNORE_OUTPUT" in cell.source:
            continue
        yield i, "".join(output_text(o) for o in cell.outputs if o.output_type != "error")


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_no_committed_output_prints_rounding_noise(path):
    for i, text in compared_outputs(REPO_DIR / path):
        found = noise_in(text)
        assert found is None, (
            f"{path} cell {i} prints {found}, rounding noise that differs from one CPU to the next, in an output "
            "nbval compares. Print the bound it meets (course_lib.checks.below(err, 1e-12)) or fewer digits "
            "(see CONTRIBUTING.md, 'Printing figures that every CPU prints alike').")


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_no_compared_output_names_the_machine(path):
    mine = this_machine()
    for i, text in compared_outputs(REPO_DIR / path):
        for line in text.splitlines():
            found = names_the_machine(line, mine)
            assert found is None, (
                f"{path} cell {i} prints {found!r}, which names the machine it ran on, in an output nbval compares "
                f"(a learner's machine prints something else):\n  {line.strip()[:300]}\nPrint what every machine "
                "prints alike, or move the line to a cell tagged nbval-ignore-output whose prose claims no number.")


@pytest.mark.parametrize("path", sorted(NOTEBOOKS + [p.relative_to(REPO_DIR).as_posix()
                                                     for p in (REPO_DIR / "exercises").glob("[0-9][0-9]_*.ipynb")]))
def test_no_committed_output_shows_where_it_was_recorded(path):
    """Ignored outputs and tracebacks too: the book shows them. `course execute` writes paths inside the
    checkout relative to it (nbtools.clean_metadata)."""
    where = [str(REPO_DIR), str(Path.home())]
    pattern = re.compile(r"(?<![\w.~])(?:/root|/home/[^/\s]+|/Users/[^/\s]+|/\S*/course_lib/)|" +
                         "|".join(re.escape(w) + "/" for w in where if w != "/"))
    for i, cell in enumerate(nbtools.read(REPO_DIR / path).cells):
        for output in cell.get("outputs", []):
            text = re.sub(r"\x1b\[[0-9;]*m", "", output_text(output))
            found = pattern.search(text)
            assert found is None, (
                f"{path} cell {i} shows {found.group(0)!r}, a folder of the machine that recorded it. Say "
                "'your cache folder' or print the path relative to the home folder or the course (~/..., "
                "course_lib/...); tracebacks are made relative by `course execute`.")


def test_course_execute_writes_paths_inside_the_checkout_relative_to_it():
    cell = nbformat.v4.new_code_cell("1 / 0")
    cell.outputs = [nbformat.v4.new_output("error", ename="ZeroDivisionError", evalue="division by zero",
                                           traceback=[f"File \x1b[32m{REPO_DIR}/course_lib/tensor/tensor.py:209\x1b[39m"]),
                    nbformat.v4.new_output("stream", name="stderr", text=f"{REPO_DIR}/course_lib/fast/plans.py:68: Warning")]
    nb = nbtools.clean_metadata(nbformat.v4.new_notebook(cells=[cell]))
    assert nb.cells[0].outputs[0].traceback == ["File \x1b[32mcourse_lib/tensor/tensor.py:209\x1b[39m"]
    assert nb.cells[0].outputs[1].text == "course_lib/fast/plans.py:68: Warning"


def test_the_searches():
    assert noise_in("largest gradient difference: 2.7755575615628914e-17") == "2.7755575615628914e-17"
    assert noise_in("worst relative error 7.5e-12") == "7.5e-12"
    assert noise_in("loss: 1.2058441129606616") == "1.2058441129606616"
    for fine in ("below 1e-12", "loss 2.3026, accuracy 0.838", "x.grad = 22015.456049", "lr 3.0e-04",
                 "1797 digits", "[0.78728697 0.48069102]", "shape (4096, 12)"):
        assert noise_in(fine) is None, fine
    for machine in ("numba 0.68.1 | threads: 2", "on 8 cores", "torch.get_num_threads() = 4", "12 logical cpus",
                    "cache: /root/.cache/ipython", "/home/ada/dlsys/course_lib/fast/ops.py", "C:\\Users\\ada",
                    "/Users/ada/x", "Linux-6.1.0-x86_64-with-glibc2.36", "Python 3.11.7", "AMD EPYC 7B13",
                    "no GPU found, CUDA kernels run on the simulator", "tensor on cuda:0", "/tmp/x.ipynb"):
        assert names_the_machine(machine), machine
    for fine in ("256 threads,   2048 B shared, 32 regs/thread", "blocks of 8, 5, 16 threads", "numba 0.68.1",
                 "kept in work/yours/ch07.py", "work/course_lib/fast/ops.py", "~/.cache/ipython/numba_cache",
                 "rank 0: a = [2, 4]", "32 regs/thread:  8 blocks per SM", "dot on the device: 2.9350171432",
                 "shape (4, 6) | memory: True"):
        assert names_the_machine(fine) is None, fine
    assert names_the_machine("saved in /srv/lab-machine-7/x", ["/srv/lab-machine-7"]) == "/srv/lab-machine-7"


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


@pytest.mark.parametrize("path, threads", RERUN)
def test_outputs_are_the_same_on_another_machine(path, threads, tmp_path):
    target = staged(path, tmp_path)
    env = other_machine(threads) | {"COURSE_WORKSPACE": str(tmp_path / "work")}
    code, out = nbval(target, env, target.parent)
    assert code == 0, (
        f"{path} prints other outputs on another learner's machine: other CPU kernels ({other_cpu()}), "
        f"{threads} Numba threads, PyTorch's threads at their default. Round what it prints and print no "
        f"thread count (CONTRIBUTING.md). nbval said:\n{out[-4000:]}")


# A probe notebook, committed with this machine's outputs: its first cell prints full-precision sums of
# vectorized kernels, its second Numba's thread count. numpy alone shows the CPU's kernels (no PyTorch to
# import), and the thread count is read without compiling anything.
NOISE = ("import numpy as np\n"
         "x = np.random.default_rng(0).standard_normal(100_000)\n"
         "print(repr(float(np.tanh(x).sum())), repr(float((x[:4096].reshape(64, 64) @ x[4096:8192].reshape(64, 64)).sum())))")
THREAD_COUNT = "import numba\nprint('threads:', numba.config.NUMBA_NUM_THREADS)"


def test_the_rerun_catches_noise_and_a_thread_count(tmp_path):
    probe = [sys.executable, "-c", NOISE]
    cpu_differs = subprocess.run(probe, capture_output=True, text=True).stdout != \
        subprocess.run(probe, capture_output=True, text=True, env={**os.environ, **other_cpu()}).stdout
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(NOISE), nbformat.v4.new_code_cell(THREAD_COUNT)])
    nb.metadata["kernelspec"] = dict(nbtools.KERNEL)
    path = tmp_path / "probe.ipynb"
    nbtools.write(nbtools.execute(nb, cwd=tmp_path), path)
    import numba  # the probe ran with this process's count: the rerun takes another

    code, out = nbval(path, other_machine("1" if numba.config.NUMBA_NUM_THREADS != 1 else "4"), tmp_path)
    assert code != 0 and "threads: " in out and "outputs differ" in out, out[-3000:]
    if not cpu_differs:
        pytest.skip("this CPU computes the probe alike with and without its vectorized kernels, so the rerun "
                    "cannot tell noise from a portable figure here (it caught the thread count)")
    assert "2 failed" in out, out[-3000:]
