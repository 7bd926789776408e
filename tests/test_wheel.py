"""The course as a package: a wheel, installed where no clone of the course is, runs a notebook
copied alone into an empty folder.

The wheel is built from the files a source archive holds (as Colab's first cell builds it) and
installed with pip, not editable, into a folder (`pip install --target`) that a fresh virtual
environment puts first on its path. The heavy packages it depends on (torch, numpy, Jupyter) come
from the course's environment through PYTHONPATH, which processes no .pth file, so the course's own
editable install there is not seen: `import course_lib` can only find the wheel's copy. Then a
lesson that reads a file shipped beside the library (lesson 09 prints the ONNX conformance report)
and a solved exercise notebook run from an empty folder, on a kernel of that environment, and the
library's commands that need the course's folder say so.

Not part of `make test` (it builds a wheel and starts two kernels: about a minute on an idle machine):
`make test-package` runs it, and CI runs that after `make test`.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import nbformat
import pytest

from course_lib import REPO_DIR

pytestmark = pytest.mark.package

SOURCES = ["pyproject.toml", "setup.py", "README.md", "course_lib", "benchmarks"]


def _copy_sources(dst):
    """What a source archive of the course holds for building the library: the tracked files (git), or
    when git is missing, the files themselves minus caches."""
    tracked = subprocess.run(["git", "-C", str(REPO_DIR), "ls-files", "-z", "--", *SOURCES],
                             capture_output=True, text=True)
    names = [n for n in tracked.stdout.split("\0") if n] if tracked.returncode == 0 else []
    if not names:
        names = [str(p.relative_to(REPO_DIR)) for s in SOURCES for p in
                 ([REPO_DIR / s] if (REPO_DIR / s).is_file() else (REPO_DIR / s).rglob("*"))
                 if p.is_file() and "__pycache__" not in p.parts]
    for name in names:
        if (REPO_DIR / name).is_file():  # a tracked file deleted in the work tree is not copied
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_DIR / name, dst / name)
    # files not yet committed (a new module while it is being written) are built too
    for name in subprocess.run(["git", "-C", str(REPO_DIR), "ls-files", "-z", "--others", "--exclude-standard", "--",
                                *SOURCES], capture_output=True, text=True).stdout.split("\0"):
        if name and (REPO_DIR / name).is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_DIR / name, dst / name)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python, env, site): a fresh virtual environment, and the folder where pip installed the wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist = tmp / "src", tmp / "dist"
    src.mkdir()
    _copy_sources(src)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(dist), str(src)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next(dist.glob("course_lib-*.whl"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = tmp / "site"   # first on the path, so that both `import` and importlib.metadata find the wheel's copy
    done = subprocess.run(pip + ["install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    shared = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    home = tmp / "home"
    home.mkdir()
    env = {"PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "HOME": str(home),
           "PYTHONPATH": os.pathsep.join([str(site), *sorted(shared)]), "LANG": os.environ.get("LANG", "C.UTF-8"),
           "JUPYTER_PATH": str(home / "jupyter"), "JUPYTER_DATA_DIR": str(home / "jupyter"),
           "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "NUMBA_ENABLE_CUDASIM": "1",
           "COURSE_CHECK_SEED": os.environ.get("COURSE_CHECK_SEED", "20261122")}
    return python, env, site


def test_the_wheel_carries_what_the_notebooks_read(installed):
    _, _, site = installed
    for name in ["course_lib/course/colab_versions.toml", "course_lib/benchmarks/RESULTS.md",
                 "course_lib/benchmarks/ch09_onnx_conformance.md", "course_lib/benchmarks/ch07_matmul_gpu.py"]:
        assert (site / name).is_file(), f"the wheel lacks {name}"


def _run(python, env, code, cwd):
    return subprocess.run([str(python), "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("source,name", [("notebooks/09_inference_engine.ipynb", "09_inference_engine.ipynb"),
                                         ("solutions/00_warmup.ipynb", "00_warmup.ipynb")],
                         ids=["lesson-09", "solved-exercises-00"])
def test_a_notebook_copied_alone_runs_on_the_installed_wheel(installed, tmp_path, source, name):
    python, env, site = installed
    folder = tmp_path / "empty"
    folder.mkdir()
    nb = nbformat.read(str(REPO_DIR / source), as_version=4)
    # a last cell that says where the library and the files it read came from
    nb.cells.append(nbformat.v4.new_code_cell(
        "import course_lib\nfrom course_lib.course.resources import benchmark_file\n"
        "print('LIBRARY', course_lib.__file__, course_lib.CHECKOUT)\nprint('FILE', benchmark_file('RESULTS.md'))"))
    nbformat.write(nb, str(folder / name))
    run = _run(python, env, f"""
        import nbformat
        from nbclient import NotebookClient
        nb = nbformat.read({name!r}, as_version=4)
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={{"metadata": {{"path": "."}}}}).execute()
        errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"
                  and "raises-exception" not in c.metadata.get("tags", [])]
        assert not errors, errors[0].ename + ": " + errors[0].evalue
        print("".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("name") == "stdout"))
    """, folder)
    assert run.returncode == 0, f"{name} failed on the installed wheel:\n{run.stderr[-4000:]}"
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines() if line.startswith(("LIBRARY ", "FILE ")))
    assert lines["LIBRARY"] == f"{site / 'course_lib' / '__init__.py'} False", lines
    assert lines["FILE"] == str(site / "course_lib" / "benchmarks" / "RESULTS.md"), lines
    assert sorted(p.name for p in folder.iterdir()) == [name], "the notebook wrote files beside itself"


def test_commands_that_need_the_course_folder_say_so(installed, tmp_path):
    python, env, _ = installed
    for command in ("build", "status"):   # the others share the code path (tests/test_colab.py)
        run = subprocess.run([str(python), "-m", "course_lib.course.commands", command], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2, run.stdout + run.stderr
        message = run.stderr.strip()
        assert message.startswith(f"`course {command}` needs a local setup") and "make lab" in message, message
        assert "https://github.com/" in message, "the message should say where to clone the course from"
