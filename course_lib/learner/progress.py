"""The learner's progress: the last result of every check, kept in work/.progress.json.

A check records its result only when it runs from the learner's exercise notebooks
(work/exercises/), so the lessons and the reference solutions never mark anything.
`course status` reads this file.
"""

import json
import os
import tempfile
import time
from pathlib import Path

from course_lib import CHECKOUT, REPO_DIR


def workspace_dir():
    """COURSE_WORKSPACE if set, else work/ in the course's folder (or ~/course-work for an installed library)."""
    default = REPO_DIR / "work" if CHECKOUT else Path.home() / "course-work"
    return Path(os.environ.get("COURSE_WORKSPACE", default)).resolve()


def progress_file():
    return Path(os.environ.get("COURSE_PROGRESS_FILE", workspace_dir() / ".progress.json"))


def should_record():
    if os.environ.get("COURSE_PROGRESS_FILE"):
        return True
    return Path.cwd().resolve().is_relative_to(workspace_dir() / "exercises")


def load():
    """{chapter: {exercise: {"passed": bool, "message": str, "time": str}}}"""
    try:
        return json.loads(progress_file().read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def record(chapter, exercise, passed, message=""):
    if not should_record():
        return
    data = load()
    data.setdefault(chapter, {})[exercise] = {
        "passed": bool(passed), "message": message[:300], "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    path = progress_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".progress-")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
