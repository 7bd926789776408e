"""The package docstrings a reader starts from name what is there: every subpackage of course_lib, and
every file of course_lib/fast (the files lesson 06 sends learners to)."""

import re
from pathlib import Path

import course_lib
import course_lib.fast

ROOT = Path(course_lib.__file__).parent


def test_course_lib_names_every_subpackage():
    packages = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())
    missing = [name for name in packages if not re.search(rf"\b{name}\b", course_lib.__doc__)]
    assert not missing, f"course_lib/__init__.py's docstring does not name the subpackages {missing}"


def test_fast_names_every_file():
    files = sorted(p.name for p in (ROOT / "fast").glob("*.py") if p.name != "__init__.py")
    missing = [name for name in files if name not in course_lib.fast.__doc__]
    assert not missing, f"course_lib/fast/__init__.py's docstring does not name {missing}"
