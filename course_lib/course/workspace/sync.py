"""`course sync`: the course's new notebooks copied into work/, and its updates brought into the
learner's copies without losing an edit (see `sync`)."""

import hashlib
import shutil
import subprocess

import nbformat

from course_lib import REPO_DIR
from course_lib.course import CourseError
from course_lib.course.workspace.copies import KINDS, backup, load_state, read_notebook, record, save_state, sha, text_sha, trust
from course_lib.learner.progress import workspace_dir


def _base_from_git(repo, src, wanted):
    """The course version whose bytes hash to `wanted`, from the repository's history (for a work/ synced
    by an older course, whose .sync.json kept only that hash); None when it cannot be found."""
    rel = src.relative_to(repo).as_posix()
    try:
        revs = subprocess.run(["git", "-C", str(repo), "log", "--format=%H", "-n", "300", "--", rel],
                              capture_output=True, text=True, timeout=30).stdout.split()
        for rev in revs:
            blob = subprocess.run(["git", "-C", str(repo), "show", f"{rev}:{rel}"], capture_output=True, timeout=30).stdout
            if hashlib.sha256(blob).hexdigest() == wanted:
                tmp = workspace_dir() / ".sync-base.ipynb"
                tmp.write_bytes(blob)
                try:
                    return record(tmp)
                finally:
                    tmp.unlink()
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def merge(base, mine, theirs):
    """Three-way merge, cell by cell, keyed by cell id.

    base:   the record (see `record`) of the course version the learner's copy started from
    mine:   the learner's copy (a notebook), theirs: the new course version (a notebook)
    Returns (notebook, edited) where `edited` counts the learner's cells carried over, or
    (None, conflicts) when the course changed or removed a cell the learner changed too.

    A cell whose source is the same in `mine` and `theirs` keeps the learner's outputs; a cell
    the learner added stays after the cell it followed; a cell the learner deleted stays deleted.
    """
    base_src = dict(base["cells"])
    mine_by_id = {c.get("id"): c for c in mine.cells}
    theirs_ids = {c.get("id") for c in theirs.cells}
    edited = {i for i, c in mine_by_id.items() if i in base_src and text_sha(c.source) != base_src[i]}
    deleted = set(base_src) - set(mine_by_id)
    changed = {c.get("id") for c in theirs.cells if c.get("id") in base_src and text_sha(c.source) != base_src[c.get("id")]}
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

    An update can also be undone behind sync's back: JupyterLab, holding the notebook open from before
    the update, offers to overwrite the file on the next save. So sync remembers the version each
    update replaced, and a copy whose changed cells are back at that version gets the update again
    (`_restore`). A copy that cannot be read is left as it is, with a line that says how to get a
    fresh one.
    """
    state, report, written = load_state(), [], []
    for kind in KINDS:
        for src in sorted((repo / kind).glob("[0-9][0-9]_*.ipynb")):
            dst = workspace_dir() / kind / src.name
            try:
                line = _sync_one(state, repo, src, dst, kind)
            except CourseError as e:
                report.append((f"left as it is: {e}", dst))
                continue
            if line:
                report.append((line, dst))
                if not line.startswith("kept"):
                    written.append(dst)
    save_state(state)
    trust(written)
    return report


def _sync_one(state, repo, src, dst, kind):
    """Bring one copy up to date, recording the course version it now follows in `state`; return the
    line for the learner, or None when there was nothing to do."""
    key = f"{kind}/{src.name}"
    base = state.get(key)
    if isinstance(base, str):  # written by an older course: only the bytes' hash was kept
        base = {"sha": base, "cells": record(dst)["cells"]} if dst.exists() and sha(dst) == base \
            else _base_from_git(repo, src, base)
    if not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        state[key] = record(src)
        return "added"
    if base is not None and base["sha"] == sha(src):  # the course did not change since the last sync
        state[key] = base
        return _restore(base, src, dst, kind)
    new = record(src)
    if sha(dst) == new["sha"]:
        line = None
    else:
        line = _update(base, src, dst, kind)
        if line.startswith("kept"):
            return line
    state[key] = {**new, "previous": {"sha": base["sha"], "cells": base["cells"]}} if base else new
    return line


def _update(base, src, dst, kind):
    """Bring one copy to the course's new version `src`; return the line that says what happened."""
    mine, theirs = read_notebook(dst), nbformat.read(str(src), as_version=4)
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


def _restore(base, src, dst, kind):
    """The course's last update again, if the copy lost it: some cell that update changed holds its
    old text again, or every cell it added is gone. That is what a save from a JupyterLab tab opened
    before the update writes. The update is merged in again as `_update` does, from the version it
    replaced, after backing the copy up; the line says so. None when the copy still has the update."""
    before = base.get("previous")
    if before is None or sha(dst) == base["sha"]:
        return None
    old, new = dict(before["cells"]), dict(base["cells"])
    mine = {c.get("id"): text_sha(c.source) for c in read_notebook(dst).cells}
    changed = [i for i in old if i in new and old[i] != new[i]]
    added = [i for i in new if i not in old]
    reverted = any(mine.get(i) == old[i] for i in changed) or (added and not any(i in mine for i in added))
    if not reverted:
        return None
    line = _update(before, src, dst, kind)
    why = "your copy had lost the course's last update, as a save from a JupyterLab tab opened before it does"
    if line.startswith("kept"):
        return f"{line}; {why}"
    return f"updated again ({why}){line.removeprefix('updated')}"


# The course's folders that lessons ask the learner to read, copied read-only into work/ so that
# JupyterLab, which serves work/ alone, shows them: {folder: (file patterns, the note in its README.md)}.
