"""The two dependency lists agree, and CI runs the same command as a learner."""

import re
import tomllib

from course_lib import REPO_DIR


def _pip_lines_of_environment_yml():
    lines, inside = [], False
    for raw in (REPO_DIR / "environment.yml").read_text().splitlines():
        line = raw.split(" #")[0].rstrip()
        if line.strip() == "- pip:":
            inside = True
            continue
        if inside and line.strip().startswith("- "):
            lines.append(line.strip()[2:].strip())
    return [l for l in lines if not l.startswith("-e")]


def _normalise(req):
    return re.sub(r"\s+", "", req).replace('"', "'").lower()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["project"]
    pip = project["dependencies"] + project["optional-dependencies"]["test"] + project["optional-dependencies"]["book"]
    assert sorted(map(_normalise, pip)) == sorted(map(_normalise, _pip_lines_of_environment_yml()))


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
