"""Every CUDA path of the course, run on the device this machine has, with one report.

    PYTHONPATH=. python3 benchmarks/gpu_verify.py --check-imports   # versions and imports only (seconds)
    PYTHONPATH=. python3 benchmarks/gpu_verify.py                   # on a GPU: every case and figure (minutes)
    PYTHONPATH=. python3 benchmarks/gpu_verify.py --simulate        # anywhere: the same at toy sizes (seconds)

    --only GROUP[,GROUP]   run some groups: puzzles, matmul, backend, mlp, custom_ops, scan, attention, limits, nccl
    --out PATH             the report (default: benchmarks/RESULTS_gpu.md on a GPU, a temporary file when simulated)
    --time-budget S        after S seconds, skip the figures not yet started (never the correctness cases)

The course's CUDA code (chapters 07, 08, 10, 11) is written and tested on Numba's CUDA simulator,
which runs each thread as Python and forgives what a GPU refuses. This script is the check on real
hardware, in two parts:

1. Correctness: each kernel in float32 (the chapter 07 scan in float64) on random inputs whose sizes
   are not multiples of a block, against PyTorch on the same GPU in float64. Each case prints PASS or
   FAIL with its largest error and the bound it must stay under. A case that raises is recorded as
   FAIL with its error's last line, and the run goes on. The exit status is 1 if any case failed.
2. Figures: the tiled matmul against cuBLAS, the CUDA backend's digits-MLP epoch, the fused scan
   against chapter 05's loop, the fused attention against scaled_dot_product_attention, the launch
   limits, NCCL. Each kernel runs once before timing, so Numba's compile time is never counted.

Progress is printed (flushed) case by case and the report is rewritten after each, so a run that is
cut off still shows how far it got. Under --simulate (NUMBA_ENABLE_CUDASIM=1) the sizes are toys and
the timings mean nothing: the run exists so that tests/test_gpu_verify.py keeps this script working.
Without --simulate the device is chosen by course_lib.device (a GPU when the driver finds one).
Before spending GPU time, `gpu_compile_only.py` compiles every kernel these cases launch for the GPU's
architecture on a machine without one (it needs the CUDA toolkit's compilers).

On the course's GPU machine, one call does it all (a few minutes, the .cu op's first build included;
the report and the log come back in $OUT):

    set -o pipefail; PYTHONUNBUFFERED=1 PYTHONPATH=. python3 benchmarks/gpu_verify.py --time-budget 240 \
        --out $OUT/RESULTS_gpu.md 2>&1 | tee $OUT/gpu_verify.log
"""

import argparse
import datetime
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GROUPS = ("puzzles", "matmul", "backend", "mlp", "custom_ops", "scan", "attention", "limits", "nccl")


# ---- what a case returns, and how it is recorded ----------------------------------------------------

class Skip(Exception):
    """A case that cannot run here; the message says why (never skipped silently)."""


@dataclass
class Check:
    """A correctness case's outcome: the largest error, the bound it must stay under, a note."""
    err: float = 0.0
    bound: float = 0.0
    note: str = ""
    status: str = ""          # "" means decided by err <= bound; "INFO" for a fact that is neither

    def decide(self):
        if self.status:
            return self.status
        return "PASS" if self.err <= self.bound else "FAIL"   # a nan error fails too


@dataclass
class Result:
    group: str
    name: str
    status: str               # PASS, FAIL, SKIP or INFO
    err: float = None
    bound: float = None
    note: str = ""
    seconds: float = 0.0


@dataclass
class Figure:
    """A table filled row by row; `skipped` lists what the time budget left out."""
    group: str
    title: str
    header: list
    rows: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    skipped: list = field(default_factory=list)

    def markdown(self):
        lines = [f"### {self.title}", "", "| " + " | ".join(self.header) + " |",
                 "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in self.rows]
        lines += [""] + [f"{n}" for n in self.notes]
        if self.skipped:
            lines += ["", "Skipped (time budget spent): " + ", ".join(self.skipped) + "."]
        return "\n".join(lines) + "\n"


class Budget:
    """Seconds left for figures; the correctness cases always run."""

    def __init__(self, seconds):
        self.start, self.seconds = time.monotonic(), seconds

    def spent(self):
        return self.seconds is not None and time.monotonic() - self.start > self.seconds


class Report:
    """The markdown report, rewritten whole after every case so a cut-off run leaves a valid file."""

    def __init__(self, path, facts):
        self.path, self.facts = Path(path), facts
        self.results, self.figures = [], []

    def counts(self):
        return {s: sum(r.status == s for r in self.results) for s in ("PASS", "FAIL", "SKIP", "INFO")}

    def write(self, finished=False):
        c = self.counts()
        lines = ["# The course's CUDA code on a real device", "",
                 f"Written by `benchmarks/gpu_verify.py` on {self.facts['date']}"
                 + ("." if finished else " (still running or cut off: the cases below are those done)."), ""]
        lines += [f"- **{k}:** {v}" for k, v in self.facts.items() if k != "date"]
        lines += ["", "## Correctness", "",
                  "float32 inputs (the chapter 07 scan float64) of sizes that are not multiples of a block, "
                  "against PyTorch in float64 on the device named above (the CPU when torch has no CUDA).", "",
                  "| group | case | result | max error | bound | note |", "|---|---|---|---|---|---|"]
        for r in self.results:
            lines.append(f"| {r.group} | {r.name} | {r.status} | {_num(r.err)} | {_num(r.bound)} | "
                         f"{r.note.replace('|', '/')} |")
        lines += ["", f"**{c['PASS']} passed, {c['FAIL']} failed, {c['SKIP']} skipped, {c['INFO']} facts.**", "",
                  "## Figures", ""]
        lines += [f.markdown() for f in self.figures] or ["(none yet)"]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("\n".join(lines) + "\n")


def _num(x):
    return "" if x is None else f"{x:.1e}"


def say(text):
    print(text, flush=True)


def last_line(exc):
    """The last line of an exception's traceback: its type and message."""
    lines = traceback.format_exception_only(type(exc), exc)
    text = lines[-1].strip() if lines else repr(exc)
    return text.splitlines()[0][:300]


# ---- running --------------------------------------------------------------------------------------

def run_cases(cases, env, report, t0):
    """Run each case; a failure is recorded with its error's last line and the run goes on."""
    for group, name, fn in cases:
        start = time.monotonic()
        try:
            check = fn(env)
            r = Result(group, name, check.decide(), note=check.note)
            if not check.status:                 # a measured case: show the error and its bound
                r.err, r.bound = check.err, check.bound
        except Skip as e:
            r = Result(group, name, "SKIP", note=str(e))
        except Exception as e:   # noqa: BLE001  (any error is this case's failure, not the run's)
            r = Result(group, name, "FAIL", note=last_line(e))
            if "ILLEGAL_ADDRESS" in r.note or "LAUNCH_FAILED" in r.note:
                r.note += " (the CUDA context is now unusable: later cases fail too; rerun with --only)"
        r.seconds = time.monotonic() - start
        report.results.append(r)
        report.write()
        err = f"max err {_num(r.err)}  bound {_num(r.bound)}" if r.err is not None else ""
        say(f"[{time.monotonic() - t0:6.1f}s] {r.status:4s} {group}/{name:28s} {err}  {r.note}".rstrip())


def run_figures(figures, env, report, t0):
    """Each figure fills its table row by row; one that raises is recorded and the run goes on."""
    for group, title, header, fn in figures:
        fig = Figure(group, title, header)
        if env.budget.spent():
            fig.skipped.append("the whole figure")
            report.figures.append(fig)
            report.write()
            say(f"[{time.monotonic() - t0:6.1f}s] SKIP figure '{title}': time budget spent")
            continue
        report.figures.append(fig)
        say(f"[{time.monotonic() - t0:6.1f}s] figure: {title}")
        say("    " + " | ".join(header))
        try:
            for row in fn(env, fig):
                fig.rows.append(row)
                report.write()
                say("    " + " | ".join(str(c) for c in row))
        except Skip as e:
            fig.notes.append(f"Not measured: {e}")
            say(f"    SKIP: {e}")
        except Exception as e:   # noqa: BLE001
            fig.notes.append(f"FAILED: {last_line(e)}")
            say(f"    FAILED: {last_line(e)}")
        for note in fig.notes:
            say(f"    {note}")
        if fig.skipped:
            say(f"    skipped (time budget spent): {', '.join(fig.skipped)}")
        report.write()


# ---- what this machine has --------------------------------------------------------------------------

def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _run(cmd):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return out.stdout.strip() or out.stderr.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"({type(e).__name__})"


def facts(simulated):
    """Device, driver and library versions, each looked up on its own so one failure hides nothing."""
    import numba
    import numpy
    import torch
    from numba import cuda

    f = {"date": datetime.date.today().isoformat()}
    if simulated:
        f["device"] = "Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1): no GPU; toy sizes, timings meaningless"
    else:
        try:
            d = cuda.get_current_device()
            name = d.name.decode() if isinstance(d.name, bytes) else d.name
            f["device"] = (f"{name}, compute capability {'.'.join(map(str, d.compute_capability))}, "
                           f"{d.MULTIPROCESSOR_COUNT} multiprocessors")
        except Exception as e:   # noqa: BLE001
            f["device"] = f"GPU (details unavailable: {last_line(e)})"
        try:
            f["CUDA driver (Numba)"] = ".".join(map(str, cuda.cudadrv.driver.driver.get_version()))
        except Exception as e:   # noqa: BLE001
            f["CUDA driver (Numba)"] = f"unknown ({last_line(e)})"
        try:
            f["CUDA runtime (Numba)"] = ".".join(map(str, cuda.runtime.get_version()))
        except Exception as e:   # noqa: BLE001
            f["CUDA runtime (Numba)"] = f"unknown ({last_line(e)})"
    if shutil.which("nvidia-smi"):
        f["nvidia-smi"] = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                "--format=csv,noheader"]).replace("\n", "; ")
    nvcc = shutil.which("nvcc")
    f["nvcc"] = _run([nvcc, "--version"]).splitlines()[-2] if nvcc else "not on PATH"
    f["python"] = f"{platform.python_version()} ({platform.machine()})"
    f["numpy"] = numpy.__version__
    f["numba"] = numba.__version__
    f["numba-cuda"] = _version("numba-cuda")
    cuda_torch = torch.cuda.is_available()
    f["torch"] = (f"{torch.__version__}, torch.version.cuda {torch.version.cuda}, "
                  f"sees a GPU: {cuda_torch}" + (f" ({torch.cuda.get_device_name()})" if cuda_torch else ""))
    f["oracle"] = "PyTorch on the GPU (float64)" if cuda_torch else "PyTorch on the CPU (float64): this torch has no CUDA"
    f["command"] = "python3 benchmarks/gpu_verify.py " + " ".join(sys.argv[1:])
    return f


# ---- the command line -------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--simulate", action="store_true", help="Numba's CUDA simulator at toy sizes")
    p.add_argument("--check-imports", action="store_true", help="import everything, print versions, exit")
    p.add_argument("--only", default="", help=f"comma-separated groups among {', '.join(GROUPS)}")
    p.add_argument("--out", default=None, help="the report's path")
    p.add_argument("--time-budget", type=float, default=None, help="seconds after which figures are skipped")
    args = p.parse_args(argv)
    args.only = [g.strip() for g in args.only.split(",") if g.strip()] or list(GROUPS)
    unknown = [g for g in args.only if g not in GROUPS]
    if unknown:
        p.error(f"unknown group(s) {unknown}; choose among {', '.join(GROUPS)}")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.simulate:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"   # read once, when numba is first imported
    sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]   # course_lib, gpu_cases
    t0 = time.monotonic()
    from course_lib import device

    simulated = device.setup(verbose=False) == "simulator"
    say(f"gpu_verify: {'simulator' if simulated else 'GPU'}; importing the course's CUDA modules ...")
    import gpu_cases

    info = facts(simulated)
    for k, v in info.items():
        say(f"  {k}: {v}")
    missing = gpu_cases.check_imports()
    for line in missing:
        say(f"  import FAILED: {line}")
    say("imports: " + ("all fine" if not missing else f"{len(missing)} failed"))
    if args.check_imports:
        return 1 if missing else 0

    out = args.out or (Path(tempfile.gettempdir()) / "course_gpu_verify_simulated.md" if simulated
                       else REPO / "benchmarks" / "RESULTS_gpu.md")
    report = Report(out, info)
    env = gpu_cases.Env(simulated, Budget(args.time_budget))
    say(f"report: {out}")
    if missing:
        report.results.append(Result("imports", "course modules", "FAIL", note="; ".join(missing)))
    run_cases([c for c in gpu_cases.CASES if c[0] in args.only], env, report, t0)
    run_figures([f for f in gpu_cases.FIGURES if f[0] in args.only], env, report, t0)
    report.write(finished=True)
    c = report.counts()
    say(f"{c['PASS']} passed, {c['FAIL']} failed, {c['SKIP']} skipped, {c['INFO']} facts "
        f"in {time.monotonic() - t0:.0f} s; report: {out}")
    return 1 if c["FAIL"] else 0


if __name__ == "__main__":
    # Run as the module `gpu_verify`, not `__main__`, so that gpu_cases (which imports Check and Skip from
    # gpu_verify) and this runner share one copy of those classes.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gpu_verify

    sys.exit(gpu_verify.main())
