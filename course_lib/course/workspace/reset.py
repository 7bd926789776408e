"""`course reset NN`: a fresh copy of a chapter's notebook, after backing the learner's up."""

import shutil

from course_lib import REPO_DIR
from course_lib.course.workspace.copies import backup, find, load_state, record, save_state, trust
from course_lib.learner.progress import workspace_dir


def reset(chapter, kind="exercises", repo=REPO_DIR):
    """Replace the learner's copy with a fresh one, after backing it up. Returns the backup or None."""
    src = find(chapter, kind, repo)
    dst = workspace_dir() / kind / src.name
    saved = backup(dst) if dst.exists() else None
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    state = load_state()
    state[f"{kind}/{src.name}"] = record(src)
    save_state(state)
    trust([dst])
    return saved
