"""The learner's workspace, work/: their own copies of the notebooks, never tracked by git.

    work/notebooks/NN_topic.ipynb   copies of the lessons
    work/exercises/NN_topic.ipynb   copies of the exercises, to fill in
    work/backups/                   every copy `course reset` replaced, timestamped
    work/course_lib/                a read-only copy of the library's source, to read in JupyterLab
    work/yours/chNN.py              the learner's passing code (see course_lib.learner.answers)
    work/.sync.json                 which course version each copy came from
    work/.progress.json             the last result of every check

`git pull` only touches the course's own folders, so it never conflicts with work/.
`sync` copies new notebooks in and brings the course's updates into the learner's copies:
opening or running a notebook is not editing it (only cell sources count), and an edited
copy is merged cell by cell after a backup (see `sync`); `course reset NN` fetches a fresh
copy after backing the old one up.
"""

import hashlib
import json
import shutil
import stat
import subprocess
import time
from pathlib import Path

import nbformat

from course_lib import REPO_DIR
from course_lib.learner.progress import workspace_dir

KINDS = ("notebooks", "exercises")


def _sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _text_sha(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _state_path():
    return workspace_dir() / ".sync.json"


def _load_state():
    try:
        return json.loads(_state_path().read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _save_state(state):
    _state_path().parent.mkdir(parents=True, exist_ok=True)
    _state_path().write_text(json.dumps(state, indent=1, sort_keys=True))


def _record(path):
    """What sync remembers of a course notebook it copied: its bytes' hash and each cell's source hash.
    The cells are what decide whether the learner edited a copy; outputs and metadata never do."""
    nb = nbformat.read(str(path), as_version=4)
    return {"sha": _sha(path), "cells": [[c.get("id"), _text_sha(c.source)] for c in nb.cells]}


def _base_from_git(repo, src, sha):
    """The course version whose bytes hash to `sha`, from the repository's history (for a work/ synced
    by an older course, whose .sync.json kept only that hash); None when it cannot be found."""
    rel = src.relative_to(repo).as_posix()
    try:
        revs = subprocess.run(["git", "-C", str(repo), "log", "--format=%H", "-n", "300", "--", rel],
                              capture_output=True, text=True, timeout=30).stdout.split()
        for rev in revs:
            blob = subprocess.run(["git", "-C", str(repo), "show", f"{rev}:{rel}"], capture_output=True, timeout=30).stdout
            if hashlib.sha256(blob).hexdigest() == sha:
                tmp = workspace_dir() / ".sync-base.ipynb"
                tmp.write_bytes(blob)
                try:
                    return _record(tmp)
                finally:
                    tmp.unlink()
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def merge(base, mine, theirs):
    """Three-way merge, cell by cell, keyed by cell id.

    base:   the record (see `_record`) of the course version the learner's copy started from
    mine:   the learner's copy (a notebook), theirs: the new course version (a notebook)
    Returns (notebook, edited) where `edited` counts the learner's cells carried over, or
    (None, conflicts) when the course changed or removed a cell the learner changed too.

    A cell whose source is the same in `mine` and `theirs` keeps the learner's outputs; a cell
    the learner added stays after the cell it followed; a cell the learner deleted stays deleted.
    """
    base_src = dict(base["cells"])
    mine_by_id = {c.get("id"): c for c in mine.cells}
    theirs_ids = {c.get("id") for c in theirs.cells}
    edited = {i for i, c in mine_by_id.items() if i in base_src and _text_sha(c.source) != base_src[i]}
    deleted = set(base_src) - set(mine_by_id)
    changed = {c.get("id") for c in theirs.cells if c.get("id") in base_src and _text_sha(c.source) != base_src[c.get("id")]}
    removed = set(base_src) - theirs_ids
    conflicts = sorted((edited & (changed | removed)) | (deleted & changed))
    if conflicts:
        return None, [mine_by_id.get(i) for i in conflicts]
    cells = []
    for c in theirs.cells:
        i = c.get("id")
        if i in deleted:
            continue
        ours = mine_by_id.get(i)
        cells.append(ours if ours is not None and (i in edited or ours.source == c.source) else c)
    # the learner's own cells, each placed after the cell that came before it in their copy
    previous = None
    for c in mine.cells:
        i = c.get("id")
        if i not in base_src and i not in theirs_ids:
            at = next((k + 1 for k, d in enumerate(cells) if d.get("id") == previous), 0)
            cells.insert(at, c)
        previous = i
    merged = nbformat.from_dict({**theirs, "cells": cells})
    return merged, len(edited) + sum(1 for c in mine.cells if c.get("id") not in base_src)


def sync(repo=REPO_DIR):
    """Bring work/ up to date with the course; return (message, path) lines for the learner.

    A copy the learner only opened or ran (same cell sources as the version it came from) takes
    the new version, keeping the learner's outputs of every cell whose source did not change. A copy
    the learner edited is merged cell by cell: the course's changes come in, the learner's edited and
    added cells stay, and the previous copy goes to work/backups/ first. Only when the course changed
    a cell that the learner changed too is the copy left alone, with a line that says which cell.
    """
    state, report = _load_state(), []
    for kind in KINDS:
        for src in sorted((repo / kind).glob("[0-9][0-9]_*.ipynb")):
            dst = workspace_dir() / kind / src.name
            key = f"{kind}/{src.name}"
            new = _record(src)
            base = state.get(key)
            if isinstance(base, str):  # written by an older course: only the bytes' hash was kept
                base = {"sha": base, "cells": _record(dst)["cells"]} if dst.exists() and _sha(dst) == base \
                    else _base_from_git(repo, src, base)
            if not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
                report.append(("added", dst))
            elif base is not None and base["sha"] == new["sha"]:
                if state.get(key) != base:
                    state[key] = base
                continue
            elif _sha(dst) == new["sha"]:
                pass
            else:
                line = _update(base, src, dst, kind)
                report.append((line, dst))
                if line.startswith("kept"):
                    continue
            state[key] = new
    _save_state(state)
    return report


def _update(base, src, dst, kind):
    """Bring one copy to the course's new version `src`; return the line that says what happened."""
    mine, theirs = nbformat.read(str(dst), as_version=4), nbformat.read(str(src), as_version=4)
    reset = f"`course reset {src.name[:2]}{' --lesson' if kind == 'notebooks' else ''}`"
    if base is None:
        return (f"kept your copy: a newer version is in {kind}/, and this copy's origin is unknown "
                f"({reset} takes the new one after backing yours up)")
    merged, info = merge(base, mine, theirs)
    if merged is None:
        first = info[0].source.strip().splitlines()[0][:60] if info[0] is not None and info[0].source.strip() else "(empty)"
        return (f"kept your edited copy: the course changed {len(info)} cell(s) that you changed too, "
                f"the first beginning \"{first}\" ({reset} takes the new version after backing yours up)")
    if info:
        saved = backup(dst)
        nbformat.write(merged, str(dst))
        return (f"updated, with your {info} edited or added cell(s) kept "
                f"(your previous copy is in {saved.relative_to(workspace_dir()).as_posix()})")
    nbformat.write(merged, str(dst))
    return "updated"


# The course's folders that learners read, copied read-only into work/ so that
# JupyterLab, which serves work/ alone, shows them: {folder: (file patterns, the note in its README.md)}.
MIRRORED = {
    "course_lib": (("*.py",), """# The course's library, to read

A read-only copy of `course_lib/`: the library the lessons run and later chapters build on. Its
chapter folders (`autograd/` for chapter 01, `tensor/` 02, `graph/` 03, `gpt/` 04, `mamba/` 05, `fast/`
06, `cuda/` 07, `custom_ops/` 08, `infer/` 09, `fused/` 10, `distributed/` 11, `capstone/` 12,
`compiler/` 13), and for chapter 00 its gradient-checking tools, also hold the course's own answers
to the exercises.
Each answer starts with the line "The course's answer to exercise NN.k (`name`): read it once your
check passes", each folder's `__init__.py` says which of its files hold answers, and `answer_key.py`
lists them all. Read an answer once your check passes: before that, the lessons and the hints point
you to everything an exercise needs.

`course lab` and `course sync` refresh this copy from the course, so edits here would be lost: your
work goes in `exercises/`.
"""),
    "benchmarks": (("*.py", "*.md"), """# The course's benchmarks, to read

A read-only copy of `benchmarks/`: the scripts that time the course's code against its peers, and
`RESULTS.md`, the figures they printed, with the machine. The lessons cite them. Run one from the
course's folder (where `git pull` puts it), for example `python benchmarks/ch05_scan.py`.
"""),
}


def mirror_library(repo=REPO_DIR):
    """Copy the folders of MIRRORED into work/, read-only, so JupyterLab can show them."""
    for name, (patterns, note) in MIRRORED.items():
        src_root, dst_root = repo / name, workspace_dir() / name
        wanted = {p.relative_to(src_root): p for pattern in patterns for p in src_root.rglob(pattern)
                  if "__pycache__" not in p.parts and p.name != "README.md"}
        wanted[Path("README.md")] = None
        for old in sorted(dst_root.rglob("*"), reverse=True) if dst_root.exists() else []:
            rel = old.relative_to(dst_root)
            if old.is_file() and rel not in wanted:
                old.chmod(stat.S_IWUSR | stat.S_IRUSR)
                old.unlink()
            elif old.is_dir() and not any(old.iterdir()):
                old.rmdir()
        for rel, src in wanted.items():
            dst = dst_root / rel
            text = note if src is None else src.read_text(encoding="utf-8")
            if dst.exists() and dst.read_text(encoding="utf-8") == text:
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            if dst.exists():
                dst.chmod(stat.S_IWUSR | stat.S_IRUSR)
            dst.write_text(text, encoding="utf-8")
            dst.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)


def stage(folder, repo=REPO_DIR):
    """A learner's workspace in `folder` whose exercise notebooks are the solved ones (for tests)."""
    folder = Path(folder).resolve()
    if folder.exists():
        for p in folder.rglob("*"):
            if p.is_file():
                p.chmod(stat.S_IWUSR | stat.S_IRUSR)
        shutil.rmtree(folder)
    for kind, source in (("notebooks", "notebooks"), ("exercises", "solutions")):
        (folder / kind).mkdir(parents=True)
        for src in sorted((repo / source).glob("[0-9][0-9]_*.ipynb")):
            shutil.copyfile(src, folder / kind / src.name)
    return folder


def find(chapter, kind="exercises", repo=REPO_DIR):
    """The course notebook of chapter "NN" in exercises/ or notebooks/."""
    matches = sorted((repo / kind).glob(f"{int(chapter):02d}_*.ipynb"))
    if not matches:
        raise SystemExit(f"no chapter {chapter} in {kind}/")
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


def reset(chapter, kind="exercises", repo=REPO_DIR):
    """Replace the learner's copy with a fresh one, after backing it up. Returns the backup or None."""
    src = find(chapter, kind, repo)
    dst = workspace_dir() / kind / src.name
    saved = backup(dst) if dst.exists() else None
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    state = _load_state()
    state[f"{kind}/{src.name}"] = _record(src)
    _save_state(state)
    return saved
