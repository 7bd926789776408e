"""The course's one-time setup of this environment (`course setup`; `course lab` repeats the quick
parts): the Jupyter kernel the notebooks name, JupyterLab's settings, and Graphviz's `dot`."""

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from course_lib.course import nbtools
from course_lib.course.printing import YELLOW, paint


def install_kernel():
    """Register this environment's kernel, with the CUDA device choice made once here."""
    from course_lib import device

    cmd = [sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3",
           "--display-name", nbtools.KERNEL["display_name"],
           # PyTorch's idle OpenMP threads otherwise spin and take the cores from the Numba kernels
           # that run next (20x slower fused kernels in chapter 10 on 2 cores)
           "--env", "OMP_WAIT_POLICY", "PASSIVE"]
    if not device.gpu_present():
        cmd += ["--env", "NUMBA_ENABLE_CUDASIM", "1"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    print("Jupyter kernel: " + ("GPU found, kernels run on it" if "NUMBA_ENABLE_CUDASIM" not in cmd
                                else "no GPU found, CUDA kernels will use Numba's simulator"))


def ensure_dot():
    """Graphviz's `dot`, which draws the lessons' graphs: installed with apt-get where that can be done
    (Debian and Ubuntu, as root), else the command for apt, Homebrew or conda, in one message."""
    if shutil.which("dot"):
        return True
    if platform.system() == "Linux" and os.geteuid() == 0 and shutil.which("apt-get"):
        print("Installing Graphviz (apt-get update; apt-get install graphviz) ...")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env)  # a fresh container has no package lists
        subprocess.run(["apt-get", "install", "-y", "-qq", "graphviz"], check=False, env=env)
        if shutil.which("dot"):
            return True
    print(paint("Graphviz's `dot` is missing, so graph pictures will not render. Install it with:\n"
                "  Debian/Ubuntu: sudo apt-get install graphviz\n  macOS:         brew install graphviz\n"
                "  conda:         conda install -c conda-forge graphviz", YELLOW))
    return False


LAB_SETTINGS = {
    # No "would you like to receive official Jupyter news?" prompt, and no update checks.
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
}


def install_lab_settings():
    """JupyterLab defaults for this environment (overrides.json in its settings folder)."""
    folder = Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "overrides.json"
    text = json.dumps(LAB_SETTINGS, indent=1) + "\n"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
