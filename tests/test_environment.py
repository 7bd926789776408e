"""The two dependency lists agree, and CI runs the same command as a learner."""

import re
import tomllib

from course_lib import REPO_DIR


def _environment_yml():
    """(conda packages, pip lines) of environment.yml."""
    conda, pip, section = [], [], None
    for raw in (REPO_DIR / "environment.yml").read_text().splitlines():
        line = raw.split(" #")[0].rstrip()
        if line and not line.startswith((" ", "-")):
            section = line.rstrip(":")                  # channels, dependencies
        elif line.strip() == "- pip:":
            section = "pip"
        elif line.strip().startswith("- ") and section in ("dependencies", "pip"):
            (pip if section == "pip" else conda).append(line.strip()[2:].strip())
    return conda, pip


def test_environment_yml_installs_the_library_with_every_pinned_group():
    """pyproject.toml is the one list of pins: environment.yml installs the library with all its optional
    groups through pip, and asks conda only for Python and what pip cannot install."""
    project = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["project"]
    conda, pip = _environment_yml()
    assert pip == [f"-e .[{','.join(sorted(project['optional-dependencies']))}]"], pip
    assert conda == ["python=3.11", "graphviz", "pip"], conda
    assert project["requires-python"] == ">=3.11"


def test_every_dependency_is_pinned():
    project = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["project"]
    for req in project["dependencies"] + project["optional-dependencies"]["test"] + project["optional-dependencies"]["book"]:
        assert "==" in req, f"not pinned: {req}"


def test_ci_runs_the_learners_test_command():
    ci = (REPO_DIR / ".ci/run").read_text()
    assert re.search(r"^make test$", ci, re.M)
    assert "graphviz" in ci and "chromium" in ci
    make = (REPO_DIR / "Makefile").read_text()
    assert re.search(r"^test: ", make, re.M) and re.search(r"^lab: ", make, re.M)
