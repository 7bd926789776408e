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

from course_lib.learner.capture import defined_here, module_source
from course_lib.learner.progress import workspace_dir

# The chapters whose closing cells run the code that a chapter's checks keep (assembled by
# course_lib.yours). A pass line names them, so the learner knows where their code goes next.
# tests/test_answers.py reads the same map from the closing cells and the yours/ modules they call.
USED_BY = {
    "01": ["01", "12", "13"],
    "02": ["02", "06", "12", "13"],
    "06": ["06", "12", "13"],
    "07": ["07"],
    "09": ["09"],
    "10": ["10"],
    "11": ["11"],
    "12": ["12", "13"],
    "13": ["13"],
    "14": ["14"],
}


def used_by(chapter):
    """", which the closing cells of chapters 02, 06 and 12 run" ("" when no chapter runs it)."""
    chapters = USED_BY.get(chapter, [])
    if not chapters:
        return ""
    if len(chapters) == 1:
        return f", which chapter {chapters[0]}'s closing cells run"
    return f", which the closing cells of chapters {', '.join(chapters[:-1])} and {chapters[-1]} run"


def folder():
    return workspace_dir() / "yours"


def module_path(chapter):
    return folder() / f"ch{chapter}.py"


def index(chapter):
    """{exercise: {"names": [argument names], "source": text, "constants": {position: number}, "time": str}}."""
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
    constants = {str(i): v for i, (n, v) in enumerate(zip(names, values)) if n is None and isinstance(v, (int, float))}
    return save(chapter, exercise, names, module_source(values), constants)


def save(chapter, exercise, names, source, constants=None):
    """Keep `source` as the learner's passing answer to `exercise`; back up what it replaces.

    constants: {argument position: number} for the check's other arguments, such as a block size."""
    from course_lib.course.workspace.copies import backup

    pieces = index(chapter)
    piece = {"names": names, "source": source, "constants": constants or {}}
    if all(pieces.get(exercise, {}).get(k) == v for k, v in piece.items()):
        return module_path(chapter)
    pieces[exercise] = {**piece, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    path = module_path(chapter)
    if path.exists():
        backup(path)
    _write(path, render(chapter, pieces))
    _write(folder() / f"ch{chapter}.json", json.dumps(pieces, indent=1))
    return path
