"""The learner's workspace, work/: their own copies of the notebooks, never tracked by git.

    work/notebooks/NN_topic.ipynb   copies of the lessons
    work/exercises/NN_topic.ipynb   copies of the exercises, to fill in
    work/backups/                   every copy `course reset` replaced, timestamped
    work/course_lib/                a read-only copy of the library's source, to read in JupyterLab
    work/yours/chNN.py              the learner's passing code (see course_lib.keep)
    work/.sync.json                 which course version each copy came from
    work/.progress.json             the last result of every check

`git pull` only touches the course's own folders, so it never conflicts with work/.
`sync` copies new notebooks in, and refreshes a copy only while the learner has not
changed it; an edited copy is left alone and `course reset NN` fetches the new version
after backing the old one up.
"""

import hashlib
import json
import shutil
import stat
import time
from pathlib import Path

from course_lib import REPO_DIR
from course_lib.progress import workspace_dir

KINDS = ("notebooks", "exercises")


def _sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


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


def sync(repo=REPO_DIR):
    """Bring work/ up to date with the course; return (message, path) lines for the learner."""
    state, report = _load_state(), []
    for kind in KINDS:
        for src in sorted((repo / kind).glob("[0-9][0-9]_*.ipynb")):
            dst = workspace_dir() / kind / src.name
            key = f"{kind}/{src.name}"
            new = _sha(src)
            if not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
                report.append(("added", dst))
            elif state.get(key) == new:
                continue
            elif _sha(dst) in (state.get(key), new):
                shutil.copyfile(src, dst)
                report.append(("updated", dst))
            else:
                report.append((f"kept your edited copy; a newer version is in {kind}/ "
                               f"(`course reset {src.name[:2]}{' --lesson' if kind == 'notebooks' else ''}` "
                               "takes it after backing yours up)", dst))
                continue
            state[key] = new
    _save_state(state)
    return report


LIBRARY_NOTE = """# The course's library, to read

A read-only copy of `course_lib/`, the code the lessons ask you to read. `course lab` and
`course sync` refresh it from the course, so edits here would be lost: your work goes in
`exercises/`.
"""


def mirror_library(repo=REPO_DIR):
    """Copy course_lib's source into work/course_lib/, read-only, so JupyterLab can show it."""
    dst_root = workspace_dir() / "course_lib"
    wanted = {p.relative_to(repo / "course_lib"): p for p in (repo / "course_lib").rglob("*.py")}
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
        text = LIBRARY_NOTE if src is None else src.read_text(encoding="utf-8")
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
    state[f"{kind}/{src.name}"] = _sha(src)
    _save_state(state)
    return saved
