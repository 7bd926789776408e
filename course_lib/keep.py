"""Where the learner's passing code is kept: work/yours/chNN.py, one module per chapter.

Each time a check passes in the learner's exercise notebook, the source of the functions it
was given (and of the notebook helpers they use) replaces that exercise's section of the
chapter's module. Only a pass saves, so a failing attempt never replaces a passing one, and
the module it replaces goes to work/backups/ first. An index, work/yours/chNN.json, says which
exercises are saved, under which names, and when.
"""

import json
import os
import tempfile
import time

from course_lib.capture import defined_here, module_source
from course_lib.progress import workspace_dir


def folder():
    return workspace_dir() / "yours"


def module_path(chapter):
    return folder() / f"ch{chapter}.py"


def index(chapter):
    """{exercise: {"names": [argument names], "source": text, "time": str}} of the saved pieces."""
    try:
        return json.loads((folder() / f"ch{chapter}.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def render(chapter, pieces):
    """The chapter's module: one section per saved exercise, in the order they were first saved."""
    parts = [f'"""Your code from chapter {chapter}, saved each time a check passed. Do not edit: the next\n'
             f'pass rewrites it (the previous version is kept in work/backups/)."""\n']
    for exercise, piece in pieces.items():
        parts.append(f"# ---- {exercise} (passed {piece['time']}) " + "-" * 40 + "\n\n" + piece["source"])
    return "\n\n".join(parts)


def record(chapter, exercise, args, kwargs):
    """Called by a check that has just passed: save the notebook-defined functions it was given."""
    values = list(args) + list(kwargs.values())
    names = [getattr(defined_here(v), "__name__", None) for v in values]
    if not any(names):
        return None
    return save(chapter, exercise, names, module_source(values))


def save(chapter, exercise, names, source):
    """Keep `source` as the learner's passing answer to `exercise`; back up what it replaces."""
    from course_lib.workspace import backup

    pieces = index(chapter)
    if pieces.get(exercise, {}).get("source") == source and pieces[exercise]["names"] == names:
        return module_path(chapter)
    pieces[exercise] = {"names": names, "source": source, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    path = module_path(chapter)
    if path.exists():
        backup(path)
    _write(path, render(chapter, pieces))
    _write(folder() / f"ch{chapter}.json", json.dumps(pieces, indent=1))
    return path
