"""The course's folders that learners read, copied read-only into work/, so that
JupyterLab, which serves work/ alone, shows them."""

import stat
from pathlib import Path

from course_lib import REPO_DIR
from course_lib.learner.progress import workspace_dir

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
