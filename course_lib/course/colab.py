"""The course in Google Colab: what a notebook's first cell sets up there.

Every notebook starts with a small cell (written by `course build`, see `course_lib.course.links`) that does
nothing outside Colab. In Colab it pip-installs this library without its dependencies, at the
notebook's own branch, and calls `setup()`, which

- installs only what the image lacks (colab_versions.toml: what a current image ships, the date it
  was read, and the versions that install beside it); torch, numpy and numba stay Colab's;
- keeps the learner's passing code for this session, in /content/course-work/yours/, so that a
  chapter's closing cells run on it as they do on a local setup (Colab forgets it when the runtime
  ends: the notebook itself, saved to Drive, is where the work lives);
- chooses where CUDA kernels run (`course_lib.device`): the GPU of a GPU runtime, else Numba's
  simulator, and says which in one line.
"""

import importlib
import os
import subprocess
import sys
import time
import tomllib
from importlib import metadata, resources
from pathlib import Path

from course_lib import __version__

WORKSPACE = Path("/content/course-work")


def versions():
    """colab_versions.toml as a dict."""
    return tomllib.loads(resources.files("course_lib.course").joinpath("colab_versions.toml").read_text(encoding="utf-8"))


def _installed(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def to_install(installed=None):
    """The "name==version" requirements this runtime still lacks: the `install` table's packages that
    are not there at that version, and the `install-if-missing` ones that are not there at all.
    installed(name) -> version or None (by default, what importlib.metadata finds)."""
    installed = installed or _installed
    table = versions()
    todo = [f"{n}=={v}" for n, v in table["install"].items() if installed(n) != v]
    todo += [f"{n}=={v}" for n, v in table["install-if-missing"].items() if installed(n) is None]
    return todo


def setup(expected_version, run=subprocess.run, workspace=WORKSPACE):
    """What the first cell calls in Colab, once the library is installed: see the module's docstring."""
    start = time.monotonic()
    if __version__ != expected_version:
        print(f"Colab: this notebook was written for the course's library {expected_version}, and "
              f"{__version__} is installed: open the notebook from the same branch as the library.")
    todo = to_install()
    if todo:
        run([sys.executable, "-m", "pip", "install", "-q", *todo], check=True)
        importlib.invalidate_caches()
    # A check that passes keeps the code where the closing cells look for it (course_lib.learner.answers).
    os.environ.setdefault("COURSE_WORKSPACE", str(workspace))
    os.environ.setdefault("COURSE_PROGRESS_FILE", str(Path(os.environ["COURSE_WORKSPACE"]) / ".progress.json"))
    added = f" (added {', '.join(r.split('==')[0] for r in todo)})" if todo else ""
    print(f"Colab: the course's library {__version__} is ready in {time.monotonic() - start:.0f} s{added}. "
          f"Passing checks keep your code in {os.environ['COURSE_WORKSPACE']}/yours/ until the runtime ends; "
          "File > Save a copy in Drive keeps the notebook.")
    from course_lib import device

    device.setup()
