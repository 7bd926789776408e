"""Choose where CUDA kernels run: a real GPU when one is usable, else Numba's CUDA simulator.

Numba reads NUMBA_ENABLE_CUDASIM once, when `numba` is first imported, so the choice
has to be made before that. Call `setup()` at the top of a notebook (course_lib.cuda
does it for you). If `numba.cuda` was already imported with the other choice, the only
fix is a kernel restart, and `setup()` says so.
"""

import ctypes
import os
import sys

_choice = None  # "gpu" or "simulator", once decided


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


def _wanted():
    """The choice: the NUMBA_ENABLE_CUDASIM or COURSE_DEVICE variable if set, else detection."""
    sim = os.environ.get("NUMBA_ENABLE_CUDASIM")
    if sim is not None:
        return "simulator" if sim.strip() not in ("", "0") else "gpu"
    forced = os.environ.get("COURSE_DEVICE", "").lower()
    if forced in ("gpu", "simulator"):
        return forced
    return "gpu" if gpu_present() else "simulator"


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
    if _choice == "simulator":
        return ("CUDA: no usable GPU found, so kernels run on Numba's CUDA simulator "
                "(NUMBA_ENABLE_CUDASIM=1): slow, but the same code runs unchanged on a GPU.")
    if _choice == "gpu":
        return "CUDA: a GPU was found; kernels run on it."
    return "CUDA: not chosen yet; call course_lib.device.setup()."


def using_simulator():
    return setup(verbose=False) == "simulator"
