"""The environment report that chapter 00 shows: versions, and where CUDA kernels will run."""

import platform
import shutil
import subprocess
from importlib import metadata

PACKAGES = ["torch", "numpy", "numba", "numba-cuda", "jupyterlab", "matplotlib", "graphviz",
            "scikit-learn", "onnx", "onnxruntime", "tqdm", "nbval"]


def versions():
    rows = {"python": platform.python_version(), "platform": platform.platform(terse=True)}
    for name in PACKAGES:
        try:
            rows[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            rows[name] = "not installed"
    dot = shutil.which("dot")
    if dot:
        out = subprocess.run([dot, "-V"], capture_output=True, text=True)
        rows["dot (graphviz)"] = (out.stderr or out.stdout).strip().split(" (")[0].replace("dot - graphviz version ", "")
    else:
        rows["dot (graphviz)"] = "MISSING: see README"
    return rows


def report():
    """Print the versions and the CUDA device choice."""
    from course_lib import device

    for name, version in versions().items():
        print(f"{name:16s} {version}")
    device.setup(verbose=False)
    print(device.describe())
