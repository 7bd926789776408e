"""Choose where CUDA kernels run: a real GPU when one is usable, else Numba's CUDA simulator.

Numba reads NUMBA_ENABLE_CUDASIM once, when `numba` is first imported, so the choice
has to be made before that. Call `setup()` at the top of a notebook (course_lib.cuda
does it for you). If `numba.cuda` was already imported with the other choice, the only
fix is a kernel restart, and `setup()` says so.

A GPU that is present is not always usable. The classic case is Colab's: its driver speaks an older
CUDA than the compiler inside Numba, so the driver refuses the PTX that Numba hands it
(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, GPU-Puzzles #48). That error would only show at the first
kernel launch, long after Numba chose the GPU. So when a GPU is there, `setup()` first runs a tiny
kernel in a separate process (`probe`); when the driver refuses the PTX, it tries again with
nvJitLink, which compiles the PTX itself (the fix NVIDIA's numba-cuda recommends); and when that
fails too, it chooses the simulator and says why in one line.
"""

import ctypes
import os
import re
import subprocess
import sys

_choice = None  # "gpu" or "simulator", once decided
_why = ""       # why a GPU that is present is not used, in a few words


class RestartKernel(RuntimeError):
    """numba.cuda was imported before the device could be chosen."""


def gpu_present():
    """True when the CUDA driver loads and reports at least one device.

    Asks the driver library directly through ctypes, so numba and torch stay unimported.
    """
    names = {"win32": ["nvcuda.dll"], "darwin": []}.get(sys.platform, ["libcuda.so.1", "libcuda.so"])
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(count)) == 0:
            return count.value > 0
    return False


_PROBE = """
import numpy as np
from numba import cuda

@cuda.jit
def add_one(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] += 1

a = np.arange(5, dtype=np.float32)
d = cuda.to_device(a)
add_one[1, 32](d)
assert (d.copy_to_host() == a + 1).all(), "the probe kernel computed a wrong result"
"""

# nvJitLink links the PTX itself, so a driver older than Numba's compiler can still load the result
MVC = {"NUMBA_CUDA_ENABLE_PYNVJITLINK": "1"}


def probe(env=None, timeout=300):
    """Compile and launch a tiny kernel on the GPU in a fresh process: (True, "") or (False, its stderr)."""
    run = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "NUMBA_ENABLE_CUDASIM": "0", **(env or {})})
    return (True, "") if run.returncode == 0 else (False, run.stderr)


def _ptx_mismatch(stderr):
    return "UNSUPPORTED_PTX_VERSION" in stderr or "Unsupported .version" in stderr


def explain(stderr):
    """A few words on why the probe failed, from its error output."""
    if _ptx_mismatch(stderr):
        m = re.search(r"Unsupported \.version (\S+?);? current version is '([^']+)'", stderr)
        versions = f" (PTX {m[1]}; the driver reads up to {m[2]})" if m else ""
        return ("the GPU's driver is older than the CUDA compiler inside Numba, so it refuses the compiled "
                f"kernels{versions}: CUDA_ERROR_UNSUPPORTED_PTX_VERSION, as in GPU-Puzzles #48")
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return f"a test kernel failed: {lines[-1] if lines else 'no error message'}"


def _usable_gpu():
    """Run the probe; on a PTX mismatch, again with nvJitLink (kept for this process and its children)."""
    global _why
    ok, err = probe()
    if not ok and _ptx_mismatch(err):
        ok, _ = probe(MVC)
        if ok:
            os.environ.update(MVC)
    _why = "" if ok else explain(err)
    return ok


def _wanted():
    """The choice: the NUMBA_ENABLE_CUDASIM or COURSE_DEVICE variable if set, else detection (a GPU
    that is present runs the probe first)."""
    sim = os.environ.get("NUMBA_ENABLE_CUDASIM")
    if sim is not None:
        return "simulator" if sim.strip() not in ("", "0") else "gpu"
    forced = os.environ.get("COURSE_DEVICE", "").lower()
    if forced in ("gpu", "simulator"):
        return forced
    return "gpu" if gpu_present() and _usable_gpu() else "simulator"


def setup(verbose=True):
    """Make the choice (once per process), print one line saying which, and return it."""
    global _choice
    if _choice is None:
        choice = _wanted()
        if "numba.cuda" in sys.modules:
            import numba

            active = "simulator" if numba.config.ENABLE_CUDASIM else "gpu"
            if active != choice:
                raise RestartKernel(
                    f"numba.cuda was imported before course_lib.device.setup() ran, and it is set up "
                    f"for the {active} while this machine needs the {choice}. Restart the kernel "
                    f"(Kernel > Restart Kernel) and run `from course_lib import device; device.setup()` "
                    f"before anything imports numba."
                )
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if choice == "simulator" else "0"
        if "numba" in sys.modules and "numba.cuda" not in sys.modules:
            import numba

            numba.config.reload_config()
        _choice = choice
        if verbose:
            print(describe())
    return _choice


def describe():
    """One line for humans: which device kernels will run on."""
    if _choice == "simulator" and _why:
        return (f"CUDA: a GPU is here, but {_why}; so kernels run on Numba's CUDA simulator instead (slow, same "
                "code). A numba-cuda built for this driver (pip install numba-cuda[cu12]) or a newer driver fixes it.")
    if _choice == "simulator":
        return ("CUDA: no usable GPU found, so kernels run on Numba's CUDA simulator "
                "(NUMBA_ENABLE_CUDASIM=1): slow, but the same code runs unchanged on a GPU.")
    if _choice == "gpu":
        return "CUDA: a GPU was found; kernels run on it."
    return "CUDA: not chosen yet; call course_lib.device.setup()."


def using_simulator():
    return setup(verbose=False) == "simulator"
