"""The course in Colab and Binder, tested without either: Colab cannot be reached from here.

- Every notebook carries the launch links and the Colab cell that `course build` writes from
  pyproject.toml's Repository, and the cell does nothing outside Colab;
- with `google.colab` faked, the cell installs the library from the notebook's branch, then
  `colab.setup` installs only what the image lacks and keeps passing code for the session;
- colab_versions.toml (what a Colab image ships, with the date it was read) is consistent: every
  dependency of the course is shipped, installed or said to be unneeded there, nothing Colab ships is
  installed again, and every dependency of what is installed is met by the shipped versions;
- the GPU/simulator choice: no GPU, a GPU whose driver refuses Numba's PTX (fixed by nvJitLink, or
  not), and the probe kernel itself, run on the simulator.
"""

import datetime
import subprocess
import sys
import tomllib
import types

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from course_lib import REPO_DIR, __version__, device
from course_lib.course import colab, commands, links, nbtools

NOTEBOOKS = [p for folder in ("notebooks", "solutions", "exercises")
             for p in sorted((REPO_DIR / folder).glob("[0-9][0-9]_*.ipynb"))]
PROJECT = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["project"]
VERSIONS = colab.versions()


def _cell(nb, cell_id):
    found = [c for c in nb.cells if c.get("id") == cell_id]
    assert len(found) == 1, f"expected one cell with id {cell_id!r}, found {len(found)}"
    return found[0]


# ---- the cells in every notebook ----------------------------------------------------------------

def test_launch_cells_and_badges_are_up_to_date():
    stale = links.update(check_only=True)
    assert not stale, f"out of date: {[p.name for p in stale]}; run `course build`"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_notebook_opens_in_colab_and_binder(path):
    nb = nbtools.read(path)
    setup = _cell(nb, links.SETUP_ID)
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert first_code is setup, f"{path.name}: the Colab cell must be the first code cell"
    assert {"nbval-skip", "remove-cell"} <= set(setup.metadata["tags"])
    assert setup.source == links.setup_source() and not setup.get("outputs")
    opened_as = ("notebooks/" if path.parent.name == "notebooks" else "exercises/") + path.name
    text = _cell(nb, links.LINKS_ID).source
    assert links.colab_url(opened_as) in text and links.binder_url(opened_as) in text


def test_links_are_built_from_the_repository_setting(tmp_path):
    owner, name = links.repository()
    assert PROJECT["urls"]["Repository"].rstrip("/").endswith(f"/{owner}/{name}")
    assert links.colab_url("notebooks/07_cuda.ipynb") == (
        f"https://colab.research.google.com/github/{owner}/{name}/blob/main/notebooks/07_cuda.ipynb")
    assert links.binder_url("exercises/07_cuda.ipynb").endswith("?labpath=work%2Fexercises%2F07_cuda.ipynb")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[project.urls]\nRepository = "https://example.org/x"\n')
    with pytest.raises(ValueError, match="github.com/OWNER/NAME"):
        links.repository(tmp_path)


def test_inserting_the_cells_twice_changes_nothing(tmp_path):
    path = REPO_DIR / "notebooks" / "00_welcome.ipynb"
    nb = nbtools.read(path)
    nb.cells = [c for c in nb.cells if c.get("id") not in (links.LINKS_ID, links.SETUP_ID)]
    once = links.with_launch_cells(nb, path)
    twice = links.with_launch_cells(once, path)
    assert nbtools.dumps(once) == nbtools.dumps(twice) == path.read_text(encoding="utf-8")
    assert [c.get("id") for c in once.cells[1:3]] == [links.LINKS_ID, links.SETUP_ID]


# ---- the cell, with google.colab faked ----------------------------------------------------------

@pytest.fixture
def calls(monkeypatch):
    """subprocess.run and colab.setup recorded instead of run."""
    seen = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: seen.append(("run", argv)))
    monkeypatch.setattr(colab, "setup", lambda version: seen.append(("setup", version)))
    return seen


def test_the_cell_does_nothing_outside_colab(calls, monkeypatch):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(links.setup_source(), {})
    assert calls == []


def test_in_colab_the_cell_installs_the_library_from_the_notebooks_branch(calls, monkeypatch):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    exec(links.setup_source(), {})
    owner, name = links.repository()
    assert calls == [
        ("run", [sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                 f"course_lib @ https://github.com/{owner}/{name}/archive/refs/heads/main.zip"]),
        ("setup", __version__),
    ]


def _image(gpu):
    shipped = {**VERSIONS["ships"], **(VERSIONS["ships-gpu"] if gpu else {})}
    return lambda name: shipped.get(name)


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu-image", "cpu-image"])
def test_colab_setup_installs_only_what_the_image_lacks(gpu, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(colab, "_installed", _image(gpu))
    monkeypatch.delenv("COURSE_WORKSPACE", raising=False)
    monkeypatch.delenv("COURSE_PROGRESS_FILE", raising=False)
    monkeypatch.setattr(device, "setup", lambda verbose=True: "simulator")
    pip = []
    colab.setup(__version__, run=lambda argv, check: pip.append(argv), workspace=tmp_path / "course-work")
    wanted = [f"{n}=={v}" for n, v in VERSIONS["install"].items()]
    if not gpu:
        wanted += [f"{n}=={v}" for n, v in VERSIONS["install-if-missing"].items()]
    assert pip == [[sys.executable, "-m", "pip", "install", "-q", *wanted]]
    assert not {"torch", "numpy", "numba"} & {r.split("==")[0] for r in wanted}
    import os

    assert os.environ["COURSE_WORKSPACE"] == str(tmp_path / "course-work")   # checks keep passing code there
    out = capsys.readouterr().out
    assert "yours/" in out and "Save a copy in Drive" in out and len(out.strip().splitlines()) == 1


def test_colab_setup_says_when_the_library_is_not_the_notebooks_version(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(colab, "to_install", lambda: [])
    monkeypatch.setattr(device, "setup", lambda verbose=True: "simulator")
    monkeypatch.setenv("COURSE_WORKSPACE", str(tmp_path))
    colab.setup("0.0.1", run=None)
    assert "written for the course's library 0.0.1" in capsys.readouterr().out


def test_installed_library_says_which_commands_need_a_local_setup(monkeypatch, capsys):
    monkeypatch.setattr(commands, "CHECKOUT", False)
    for command in ("status", "build", "stage", "execute"):
        argv = [command] + (["x"] if command in ("stage", "execute") else [])
        assert commands.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"`course {command}` needs a local setup") and len(err.splitlines()) == 1


# ---- the versions file --------------------------------------------------------------------------

def _names(table):
    return {canonicalize_name(n) for n in VERSIONS[table]}


def test_the_colab_versions_file_says_when_and_where_it_was_read():
    checked = datetime.date.fromisoformat(VERSIONS["checked"])
    assert checked <= datetime.date.today()
    assert VERSIONS["source"].startswith("https://github.com/googlecolab/backend-info")
    from packaging.specifiers import SpecifierSet

    assert VERSIONS["python"] in SpecifierSet(PROJECT["requires-python"]), "Colab's Python is older than the course needs"


def test_every_dependency_of_the_course_is_accounted_for_on_colab():
    needed = {canonicalize_name(Requirement(r).name) for r in PROJECT["dependencies"]}
    known = _names("ships") | _names("ships-gpu") | _names("install") | _names("install-if-missing") | _names("not-needed")
    assert needed <= known, f"not shipped by Colab, not installed there, not said to be unneeded: {needed - known}"
    shipped = _names("ships") | _names("ships-gpu")
    assert not _names("install") & shipped, "never install again what Colab ships (a loaded package breaks)"
    assert _names("install-if-missing") <= _names("ships-gpu") and not _names("install-if-missing") & _names("ships")


@pytest.mark.parametrize("table,images", [("install", ("ships", "ships-gpu")), ("install-if-missing", ("ships",))])
def test_what_the_cell_installs_fits_what_colab_ships(table, images):
    """Every dependency of an installed package that Colab ships is met by the shipped version, on every
    image it is installed on: otherwise pip would replace a package Colab's runtime relies on."""
    environment = {"python_version": ".".join(VERSIONS["python"].split(".")[:2]), "python_full_version": VERSIONS["python"],
                   "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}
    problems = []
    for image in images:
        shipped = {canonicalize_name(n): v for n, v in {**VERSIONS["ships"], **VERSIONS[image]}.items()}
        for name, version in VERSIONS[table].items():
            requires = VERSIONS["requires"].get(f"{name}=={version}")
            assert requires is not None, f"[requires] lacks {name}=={version}: resolve it (see the file's header)"
            for line in requires:
                req = Requirement(line)
                if req.marker and not req.marker.evaluate(environment):
                    continue
                have = shipped.get(canonicalize_name(req.name))
                if have is not None and not req.specifier.contains(have, prereleases=True):
                    label = "GPU" if image == "ships-gpu" else "CPU"
                    problems.append(f"{name}=={version} needs {req}; Colab's {label} image has {have}")
    assert not problems, "\n".join(problems)


def test_the_versions_the_cell_installs_are_the_courses_where_colab_allows():
    pins = {canonicalize_name(Requirement(r).name): str(Requirement(r).specifier)[2:] for r in PROJECT["dependencies"]}
    for name, version in {**VERSIONS["install"], **VERSIONS["install-if-missing"]}.items():
        if version != pins[canonicalize_name(name)]:
            # only where the header explains why the course's own pin does not install there
            header = (REPO_DIR / "course_lib/course/colab_versions.toml").read_text().split("checked =")[0]
            assert f"{name} {pins[canonicalize_name(name)]}" in header, f"{name}: {version} on Colab, unexplained"


# ---- GPU or simulator ---------------------------------------------------------------------------

PTX_ERROR = ("numba.cuda.cudadrv.driver.LinkerError: [222] Call to cuLinkAddData results in "
             "CUDA_ERROR_UNSUPPORTED_PTX_VERSION\nptxas application ptx input, line 9; fatal   : "
             "Unsupported .version 8.5; current version is '8.4'\n")


@pytest.fixture
def undecided(monkeypatch):
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    monkeypatch.delenv("NUMBA_CUDA_ENABLE_PYNVJITLINK", raising=False)
    monkeypatch.setattr(device, "_why", "")
    monkeypatch.setattr(device, "_choice", None)
    probes = []
    monkeypatch.setattr(device, "probe", lambda env=None: probes.append(env) or (True, ""))
    return probes


def test_no_gpu_means_the_simulator_without_probing(undecided, monkeypatch):
    monkeypatch.setattr(device, "gpu_present", lambda: False)
    assert device._wanted() == "simulator" and undecided == []


def test_a_gpu_that_runs_the_probe_is_used(undecided, monkeypatch):
    monkeypatch.setattr(device, "gpu_present", lambda: True)
    assert device._wanted() == "gpu" and undecided == [None]


def test_a_driver_older_than_numbas_compiler_falls_back_to_the_simulator(undecided, monkeypatch):
    monkeypatch.setattr(device, "gpu_present", lambda: True)
    monkeypatch.setattr(device, "probe", lambda env=None: undecided.append(env) or (False, PTX_ERROR))
    assert device._wanted() == "simulator"
    assert undecided == [None, device.MVC], "nvJitLink should be tried before giving up on the GPU"
    monkeypatch.setattr(device, "_choice", "simulator")
    line = device.describe()
    assert "\n" not in line and "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" in line and "simulator" in line
    assert "PTX 8.5; the driver reads up to 8.4" in line


def test_a_ptx_mismatch_that_nvjitlink_fixes_keeps_the_gpu(undecided, monkeypatch):
    import os

    monkeypatch.setattr(device, "gpu_present", lambda: True)
    monkeypatch.setattr(device, "probe", lambda env=None: undecided.append(env) or ((True, "") if env else (False, PTX_ERROR)))
    assert device._wanted() == "gpu"
    assert os.environ.get("NUMBA_CUDA_ENABLE_PYNVJITLINK") == "1", "the fix must reach Numba in this process"


def test_the_probe_kernel_runs(monkeypatch):
    """The probe's own kernel, run on the simulator (the GPU path is the same code)."""
    ok, err = device.probe(env={"NUMBA_ENABLE_CUDASIM": "1"})
    assert ok, err


# ---- Binder -------------------------------------------------------------------------------------

def test_binder_builds_the_conda_environment_and_sets_the_course_up():
    """Binder installs environment.yml (which installs the library itself), then runs postBuild, whose
    `course setup` makes work/, where the Binder links open the learner's copies."""
    env = (REPO_DIR / "environment.yml").read_text()
    assert "- -e ." in env and "graphviz" in env
    post = REPO_DIR / "postBuild"
    assert post.stat().st_mode & 0o111, "postBuild must be executable"
    assert [line for line in post.read_text().splitlines() if line and not line.startswith("#")] == [
        "set -euo pipefail", "course setup"]
    assert "labpath=work%2F" in links.binder_url("notebooks/00_welcome.ipynb")
