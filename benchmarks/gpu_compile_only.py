"""Compile every kernel that gpu_verify.py launches, for a GPU, on a machine that has none.

    PYTHONPATH=. python benchmarks/gpu_compile_only.py [--arch 9.0] [--only GROUP[,GROUP]]

The simulator runs kernels as Python, so it cannot see what a GPU's compiler refuses: an array
sized by an expression (`cuda.shared.array(TPB + 2, ...)`), a numpy function inside a kernel,
64 KiB of static shared memory. This script runs gpu_verify's correctness cases on Numba's real
CUDA target with every launch replaced by a compile: Numba's typing and lowering, NVVM to PTX for
the architecture, then ptxas to machine code, whose registers, stack and shared memory it prints.
Nothing runs, so the cases' numbers are meaningless and are not checked; what counts is which
kernels compile. Exit status 1 if one does not (besides the limits case's 64 KiB kernel, which must not).

Needs the CUDA toolkit's compilers but no driver and no GPU: libnvvm and ptxas (CUDA_HOME, default
/usr/local/cuda) and libnvrtc (Numba asks it which architectures exist; `pip install
nvidia-cuda-nvrtc` into any folder and put its lib folder on LD_LIBRARY_PATH if the toolkit lacks it).
It replaces a few internals of numba-cuda (0.30) to skip the driver, so a later numba-cuda may need
this file updated; gpu_verify.py itself uses none of them.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["NUMBA_ENABLE_CUDASIM"] = "0"          # the real CUDA target, before numba is imported
REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402
from numba.cuda import codegen, dispatcher  # noqa: E402

MUST_FAIL = {"k_big_shared"}     # gpu_verify's limits case: a GPU must refuse it


class _Device:
    """Stands in for the GPU where Numba asks for one: a name and a compute capability."""
    name = "compile only"
    MULTIPROCESSOR_COUNT = 0
    id = 0

    def __init__(self, cc):
        self.compute_capability = cc


class _HostArray(np.ndarray):
    """A 'device array' that is host memory: nothing is copied because nothing runs."""

    def copy_to_host(self, *args, **kwargs):
        return np.array(self)

    def copy_to_device(self, ary, *args, **kwargs):
        self[...] = np.asarray(ary).reshape(self.shape)


def compile_instead_of_launching(cc, ptxas, results):
    """Patch numba-cuda so that a launch compiles the kernel to PTX and runs ptxas on it, and returns."""
    device = _Device(cc)
    cuda.get_current_device = dispatcher.get_current_device = lambda: device
    cuda.to_device = lambda a, *args, **kwargs: np.array(a).view(_HostArray)
    cuda.device_array = lambda shape, dtype=np.float64, *a, **k: np.zeros(shape, dtype).view(_HostArray)
    cuda.synchronize = lambda: None
    codegen.CUDACodeLibrary._ensure_cc = lambda self, wanted: wanted or cc
    dispatcher._Kernel.bind = lambda self: None                  # binding loads the code into a context

    def launch(kernel, args, griddim, blockdim, stream=0, sharedmem=0):
        name, key = kernel.py_func.__qualname__, kernel.entry_name     # one entry per compiled specialization
        if key in results:
            return
        with tempfile.TemporaryDirectory() as tmp:
            ptx = Path(tmp) / "k.ptx"
            ptx.write_text(kernel._codelibrary.get_asm_str(cc=cc))
            out = subprocess.run([ptxas, f"-arch=sm_{cc[0]}{cc[1]}", "-v", str(ptx), "-o", os.devnull],
                                 capture_output=True, text=True)
        log = [re.sub(r"'_Z\w+'", "", ln) for ln in (out.stdout + out.stderr).splitlines()]   # drop mangled names
        usage = next((ln.split(":", 1)[1].strip() for ln in log if "Used" in ln), "")
        error = next((ln for ln in log if "error" in ln.lower()), log[-1] if log else "ptxas failed")
        results[key] = (name, out.returncode == 0, usage if out.returncode == 0 else error)
        if out.returncode:
            raise RuntimeError(f"ptxas refused {name}: {error}")

    dispatcher._Kernel.launch = launch


def compile_the_ladder_at_gpu_sizes():
    """The cases run the matmul ladder at the simulator's small tiles; the figure times it at the GPU's
    (128 x 128 tiles, 8 x 8 per thread for 2D blocking), whose registers matter: compile those too."""
    from course_lib.cuda import matmul

    A = cuda.to_device(np.zeros((256, 256), np.float32))
    refused = []
    for step, (kernel, block, tile) in matmul.LADDER.items():
        try:
            kernel[matmul.grid_for((256, 256), tile), block](A, A, A)
        except Exception as e:   # noqa: BLE001
            refused.append(f"matmul/{step} at GPU sizes: {type(e).__name__}: {str(e).strip()[:200]}")
    return refused


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="9.0", help="compute capability to compile for (9.0: H100, H200)")
    p.add_argument("--only", default="", help="comma-separated gpu_verify groups")
    args = p.parse_args(argv)
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    ptxas = shutil.which("ptxas") or str(Path(cuda_home) / "bin" / "ptxas")
    if not Path(ptxas).exists():
        print(f"no ptxas on PATH or in {cuda_home}/bin: this check needs the CUDA toolkit")
        return 2
    cc = tuple(int(v) for v in args.arch.split("."))
    results = {}
    compile_instead_of_launching(cc, ptxas, results)

    import gpu_cases
    import gpu_report

    env = gpu_cases.Env(True, gpu_report.Budget(None))   # the simulator's small sizes: the types are the same
    env.sync = lambda: None
    only = [g for g in args.only.split(",") if g]
    refused = []
    for group, name, fn in gpu_cases.CASES:
        if only and group not in only:
            continue
        try:
            fn(env)
        except gpu_report.Skip:
            pass
        except Exception as e:   # noqa: BLE001  (nothing runs, so an error here comes from compiling)
            line = next((ln for ln in str(e).splitlines() if ln.strip()), "")
            refused.append(f"{group}/{name}: {type(e).__name__}: {line.strip()[:200]}")
    if not only or "matmul" in only:
        refused += compile_the_ladder_at_gpu_sizes()
    print(f"compiled for sm_{cc[0]}{cc[1]} (one line per kernel, with its most registers over its specializations):")
    by_name = {}
    for name, ok, what in results.values():
        by_name.setdefault(name, []).append((ok, what))
    for name, runs in sorted(by_name.items()):
        ok = all(o for o, _ in runs)
        mark = "ok" if ok else ("ok, refused as it must be" if name in MUST_FAIL else "REFUSED")
        what = max((w for _, w in runs), key=lambda w: int((re.findall(r"Used (\d+) registers", w) or ["0"])[0]))
        print(f"  {mark}: {name} x{len(runs)}: {what}")
    bad = refused + [f"{n}: {w}" for n, ok, w in results.values() if not ok and n not in MUST_FAIL
                     and not any(n in r for r in refused)]
    for line in refused:
        print(f"  REFUSED before ptxas: {line}")
    print(f"{len(results)} kernels through ptxas; {len(bad)} refused")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
