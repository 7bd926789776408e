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

1. Correctness: each kernel in float32 (the chapter 07 scan float64) on random inputs whose sizes
   are not multiples of a block, against PyTorch on the same GPU in float64. Each case prints PASS or
   FAIL with its largest error and the bound it must stay under. A case that raises is recorded as
   FAIL with its error's last line, and the run goes on. The exit status is 1 if any case failed.
   Chapter 07's cases include every step of the matmul ladder at its GPU tile sizes, the registers
   and local memory the dispatcher reports for each, and the device-resident backend (results left on
   the device, the fused Adam against torch.optim, the digits MLP and the capstone GPT trained on it
   against the numpy backend).
2. Figures: the matmul ladder against cuBLAS (each step's GFLOP/s and share; goal: 2D blocking at
   least 50% of cuBLAS at n = 4096), the CUDA backend's digits-MLP epoch against PyTorch (goal: at most
   3x), the fused scan against chapter 05's loop, the fused attention against
   scaled_dot_product_attention, the launch limits, NCCL. Each kernel runs once before timing, so
   Numba's compile time is never counted.

Progress is printed (flushed) case by case and the report is rewritten after each, so a run that is
cut off still shows how far it got. Under --simulate (NUMBA_ENABLE_CUDASIM=1) the sizes are toys and
the timings mean nothing: the run exists so that tests/test_gpu_verify.py keeps this script working.
Without --simulate the device is chosen by course_lib.device (a GPU when the driver finds one); a GPU
that is there but unusable fails the run with the reason, instead of passing as a simulated one.
Before spending GPU time, `gpu_compile_only.py` compiles every kernel these cases launch for the GPU's
architecture on a machine without one (it needs the CUDA toolkit's compilers).

The cases live in gpu_cases.py (and any gpu_cases_*.py beside it), registered with gpu_report's
`@case` and `@figure`; the records (Check, Skip, the report) live in gpu_report.py, which both import.

On a GPU machine, one call does it all, in about 8 minutes on an H100 (the .cu op's first build
included; the report and the log come back in $OUT):

    set -o pipefail; PYTHONUNBUFFERED=1 PYTHONPATH=. python3 benchmarks/gpu_verify.py --time-budget 300 \
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))       # gpu_report and the files of cases

from gpu_report import Budget, Check, Figure, Report, Result, Skip, _num, last_line, say  # noqa: E402, F401

REPO = Path(__file__).resolve().parents[1]
GROUPS = ("puzzles", "matmul", "backend", "mlp", "custom_ops", "scan", "attention", "limits", "nccl")


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
    say(f"gpu_verify: {'simulator' if simulated else 'GPU'}; {device.describe()}")
    # A GPU that is there but unusable (a driver older than Numba's compiler, say) must not pass unnoticed
    # as a simulated run: that is a failure of the run, with the reason course_lib.device found.
    unusable = simulated and not args.simulate and device.gpu_present()
    say("importing the course's CUDA modules ...")
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
    if unusable:
        report.results.append(Result("device", "the GPU is used", "FAIL", note=device.describe()))
        say(f"FAIL device: a GPU is present but kernels run on the simulator: {device.describe()}")
    run_cases([c for c in gpu_cases.CASES if c[0] in args.only], env, report, t0)
    run_figures([f for f in gpu_cases.FIGURES if f[0] in args.only], env, report, t0)
    report.write(finished=True)
    c = report.counts()
    say(f"{c['PASS']} passed, {c['FAIL']} failed, {c['SKIP']} skipped, {c['INFO']} facts "
        f"in {time.monotonic() - t0:.0f} s; report: {out}")
    return 1 if c["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
