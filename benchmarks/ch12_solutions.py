"""Re-execute solutions/12_capstone.ipynb as a learner who passed chapters 01, 02 and 06 would see it.

`course execute solutions/12_capstone.ipynb` runs the solved notebook from a fresh, empty workspace: its
payoff then finds no chapter 01, 02 or 06 piece saved, and prints that the course's pieces run them. A
learner who reached chapter 12 has passed those chapters. This saves their reference answers first, as a
learner's passing checks save them (tests/carried.py runs the solved notebooks 01, 02 and 06 without their
payoffs), then runs solutions/12 from that workspace's exercises/ on the course kernel, its checks saving
chapter 12's answers and its payoff running on all four chapters, and writes the executed notebook back in
place (per-run metadata dropped, as `course execute` does). About two minutes on 2 idle cores.

    python benchmarks/ch12_solutions.py                       # solutions/12_capstone.ipynb, in place
    python benchmarks/ch12_solutions.py --keep /tmp/work      # and keep the workspace there
"""

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CARRIED = ("01", "02", "06")


def execute_as_learner(notebook, passed, keep=None, timeout=900):
    """Run `notebook` from the exercises/ of a workspace in which chapters `passed` are saved as a learner's
    passing checks save them, then write it back in place (per-run metadata dropped). ch13_solutions.py
    calls this too."""
    folder = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="solutions-"))
    work = folder / "work"
    shutil.rmtree(work, ignore_errors=True)
    os.environ["COURSE_WORKSPACE"] = str(work)
    os.environ.pop("COURSE_PROGRESS_FILE", None)
    sys.path.insert(0, str(ROOT / "tests"))
    import carried

    from course_lib.course import nbtools

    for chapter in passed:
        start = time.perf_counter()
        carried.save_reference(chapter, work)
        print(f"chapter {chapter}'s reference answers saved as a learner's ({time.perf_counter() - start:.0f} s)")
    (work / "exercises").mkdir(parents=True, exist_ok=True)
    path = Path(notebook)
    start = time.perf_counter()
    nb = nbtools.execute(nbtools.read(path), cwd=work / "exercises", timeout=timeout)
    nbtools.write(nbtools.clean_metadata(nb), path)
    print(f"executed {path} in {time.perf_counter() - start:.0f} s, from {work}")
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)


def main(notebook=ROOT / "solutions" / "12_capstone.ipynb", passed=CARRIED):
    """The command line: run `notebook` (a solutions notebook) as a learner who passed the chapters `passed`."""
    p = argparse.ArgumentParser()
    p.add_argument("notebook", nargs="?", default=str(notebook))
    p.add_argument("--keep", help="a folder to keep the workspace in (default: a temporary one, removed)")
    p.add_argument("--timeout", type=int, default=900)
    args = p.parse_args()
    execute_as_learner(args.notebook, passed, args.keep, args.timeout)


if __name__ == "__main__":
    main()
