"""The learner's copies of the course's notebooks in work/: where a chapter's notebook is, reading a
copy (or saying, in one line, why it cannot be read and where a good one is), backing one up, signing
it so that JupyterLab trusts it, and what `course sync` remembers of each copy (work/.sync.json)."""

import hashlib
import json
import shutil
import time
from pathlib import Path

import nbformat

from course_lib import REPO_DIR
from course_lib.course import CourseError
from course_lib.learner.progress import workspace_dir

KINDS = ("notebooks", "exercises")


def shown(path):
    """A path as the learner knows it: from the course's folder when it is inside it (work/...)."""
    path = Path(path).resolve()
    return path.relative_to(REPO_DIR).as_posix() if path.is_relative_to(REPO_DIR) else str(path)


def read_notebook(path):
    """The learner's notebook at `path`; a CourseError that says where a good copy is when the file is
    not a notebook (a save cut short, an edit by hand)."""
    try:
        return nbformat.read(str(path), as_version=4)
    except FileNotFoundError:
        raise
    except Exception as e:  # nbformat's NotJSONError, a ValidationError, a UnicodeDecodeError, ...
        path = Path(path)
        checkpoint = path.parent / ".ipynb_checkpoints" / f"{path.stem}-checkpoint{path.suffix}"
        kind = "--lesson " if path.parent.name == "notebooks" else ""
        last = (f"JupyterLab's last checkpoint of it is {checkpoint.name} in {path.parent.name}/.ipynb_checkpoints/, "
                if checkpoint.exists() else "")
        raise CourseError(f"{shown(path)} is not a notebook that can be read ({type(e).__name__}: a save cut short?); "
                          f"{last}and `course reset {kind}{path.name[:2]}` keeps the broken file in "
                          f"work/backups/ and gives you a fresh copy") from None


def find(chapter, kind="exercises", repo=REPO_DIR):
    """The course notebook of chapter "NN" (a number, as text) in exercises/ or notebooks/."""
    chapters = sorted({p.name[:2] for p in (repo / kind).glob("[0-9][0-9]_*.ipynb")})
    span = f"{chapters[0]} to {chapters[-1]}" if chapters else "none yet"
    if not str(chapter).strip().isdigit():
        raise CourseError(f"'{chapter}' is not a chapter number: give its two digits, as in "
                          f"`course check 01` (the chapters with {kind} are {span}; `course status` lists them)")
    matches = sorted((repo / kind).glob(f"{int(chapter):02d}_*.ipynb"))
    if not matches:
        raise CourseError(f"there is no chapter {int(chapter):02d} in the course's {kind}/: "
                          f"the chapters are {span} (`course status` lists them)")
    return matches[0]


def backup(path):
    """Copy a learner's notebook to work/backups/ with a timestamp; return the backup path."""
    folder = workspace_dir() / "backups"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = folder / f"{path.stem}.{stamp}{path.suffix}"
    n = 1
    while target.exists():
        target = folder / f"{path.stem}.{stamp}-{n}{path.suffix}"
        n += 1
    shutil.copy2(path, target)
    return target


def trust_dir():
    """Where JupyterLab's notary keeps the signatures of the notebooks the course trusts (`course lab`
    points the server at it): work/.jupyter/."""
    return workspace_dir() / ".jupyter"


def trust(paths):
    """Sign the notebooks the course wrote into work/, so that JupyterLab trusts them: their saved
    outputs (the lessons' graphs, as SVG) show when they open, and the server logs no "is not trusted".
    A notebook JupyterLab saves stays trusted: the server signs it again."""
    from nbformat.sign import NotebookNotary

    if not paths:
        return
    trust_dir().mkdir(parents=True, exist_ok=True)
    notary = NotebookNotary(data_dir=str(trust_dir()))
    try:
        for path in paths:
            notary.sign(nbformat.read(str(path), as_version=4))
    finally:
        notary.store.close()


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def text_sha(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def state_path():
    return workspace_dir() / ".sync.json"


def load_state():
    try:
        return json.loads(state_path().read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def save_state(state):
    state_path().parent.mkdir(parents=True, exist_ok=True)
    state_path().write_text(json.dumps(state, indent=1, sort_keys=True))


def record(path):
    """What sync remembers of a course notebook it copied: its bytes' hash and each cell's source hash.
    The cells are what decide whether the learner edited a copy; outputs and metadata never do."""
    nb = read_notebook(path)
    return {"sha": sha(path), "cells": [[c.get("id"), text_sha(c.source)] for c in nb.cells]}
