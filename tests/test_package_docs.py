"""The package docstrings a reader starts from name what is there: every subpackage of course_lib, every
file of course_lib/fast (the files lesson 06 sends learners to), and every module of the course's
tooling (course_lib/course and its workspace/) and of the learner's record (course_lib/learner)."""

import re
from pathlib import Path

import pytest

import course_lib
import course_lib.course
import course_lib.course.workspace
import course_lib.fast
import course_lib.learner

ROOT = Path(course_lib.__file__).parent


def test_course_lib_names_every_subpackage():
    packages = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())
    missing = [name for name in packages if not re.search(rf"\b{name}\b", course_lib.__doc__)]
    assert not missing, f"course_lib/__init__.py's docstring does not name the subpackages {missing}"


def test_fast_names_every_file():
    files = sorted(p.name for p in (ROOT / "fast").glob("*.py") if p.name != "__init__.py")
    missing = [name for name in files if name not in course_lib.fast.__doc__]
    assert not missing, f"course_lib/fast/__init__.py's docstring does not name {missing}"


@pytest.mark.parametrize("package", [course_lib.course, course_lib.course.workspace, course_lib.learner],
                         ids=lambda p: p.__name__)
def test_the_tooling_and_the_learners_record_name_every_module(package):
    folder = Path(package.__file__).parent
    names = sorted(p.name for p in folder.glob("*.py") if p.name != "__init__.py")
    names += sorted(f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").is_file() or p.name == "shell")
    missing = [name for name in names if name not in package.__doc__]
    assert not missing, f"{folder.relative_to(ROOT.parent)}/__init__.py's docstring does not name {missing}"
