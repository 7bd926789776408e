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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("notebook", nargs="?", default=str(ROOT / "solutions" / "12_capstone.ipynb"))
    p.add_argument("--keep", help="a folder to keep the workspace in (default: a temporary one, removed)")
    p.add_argument("--timeout", type=int, default=900)
    args = p.parse_args()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ch12-solutions-"))
    work = folder / "work"
    if work.exists():
        shutil.rmtree(work)
    os.environ["COURSE_WORKSPACE"] = str(work)
    os.environ.pop("COURSE_PROGRESS_FILE", None)
    sys.path.insert(0, str(ROOT / "tests"))
    import carried

    from course_lib.course import nbtools

    start = time.perf_counter()
    for chapter in CARRIED:
        carried.save_reference(chapter, work)
    print(f"the reference answers of chapters {', '.join(CARRIED)} saved as a learner's in {work} "
          f"({time.perf_counter() - start:.0f} s)")
    (work / "exercises").mkdir(parents=True, exist_ok=True)
    path = Path(args.notebook)
    start = time.perf_counter()
    nb = nbtools.execute(nbtools.read(path), cwd=work / "exercises", timeout=args.timeout)
    nbtools.write(nbtools.clean_metadata(nb), path)
    print(f"executed {path} in {time.perf_counter() - start:.0f} s")
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
