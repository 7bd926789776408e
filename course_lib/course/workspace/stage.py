"""`course stage DIR`: a learner's workspace whose exercise notebooks are the solved ones, which the
tests run as a learner's (the Makefile's `test`)."""

import shutil
import stat
from pathlib import Path

from course_lib import REPO_DIR
from course_lib.course import CourseError
from course_lib.learner.progress import workspace_dir

STAGED = ".staged"  # the mark of a folder `stage` made, which it may empty and fill again


def stage(folder, repo=REPO_DIR):
    """A learner's workspace in `folder` whose exercise notebooks are the solved ones (for tests). A
    folder that is there already is emptied first, but only one that `stage` made: never the learner's
    workspace, nor a folder with other things in it."""
    folder = Path(folder).resolve()
    if folder.exists() and any(folder.iterdir()):
        if folder == workspace_dir() or (folder / ".sync.json").exists() or not _staged(folder, repo):
            raise CourseError(f"{folder} is there already and `course stage` did not make it: it would be "
                              "emptied, so name a new folder (or one an earlier `course stage` made)")
        for p in folder.rglob("*"):
            if p.is_file():
                p.chmod(stat.S_IWUSR | stat.S_IRUSR)
        shutil.rmtree(folder)
    for kind, source in (("notebooks", "notebooks"), ("exercises", "solutions")):
        (folder / kind).mkdir(parents=True)
        for src in sorted((repo / source).glob("[0-9][0-9]_*.ipynb")):
            shutil.copyfile(src, folder / kind / src.name)
    (folder / STAGED).write_text("Made by `course stage`: the next `course stage` here empties it first.\n")
    return folder


def _staged(folder, repo):
    """Whether `folder` is one that `stage` made: its mark, or (made before the mark) notebooks/ and
    exercises/ holding only the course's notebooks."""
    if (folder / STAGED).exists():
        return True
    course = {p.name for source in ("notebooks", "solutions") for p in (repo / source).glob("*.ipynb")}
    kinds = [folder / "notebooks", folder / "exercises"]
    return all(k.is_dir() for k in kinds) and all(p.name in course for k in kinds for p in k.glob("*.ipynb"))
