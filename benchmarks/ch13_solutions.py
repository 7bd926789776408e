"""Re-execute solutions/13_compiler.ipynb as a learner who passed chapters 01, 02, 06 and 12 would see it.

The payoff of chapter 13 compiles the learner's chapter 12 GPT, assembled from whatever they saved, and
prints whose pieces run it. `course execute solutions/13_compiler.ipynb` runs the notebook from an empty
workspace, so that line would say the course's pieces run chapters 01 to 12, and the compiled step would
have none of the islands a learner's numpy backwards make. This script first saves the reference answers of
chapters 01, 02, 06 and 12 as a learner's passing checks save them (tests/carried.py runs each solved
notebook without its payoff, in one workspace, in the course's order), then runs solutions/13 from that
workspace's exercises/ on the course kernel and writes the executed notebook back in place (per-run
metadata dropped, as `course execute` does). A few minutes on 2 idle cores.

    python benchmarks/ch13_solutions.py                       # solutions/13_compiler.ipynb, in place
    python benchmarks/ch13_solutions.py --keep /tmp/work      # and keep the workspace there
"""

from pathlib import Path

import ch12_solutions

ROOT = Path(__file__).resolve().parents[1]
PASSED = ("01", "02", "06", "12")     # what chapter 13's payoff runs of the learner's, besides chapter 13

if __name__ == "__main__":
    ch12_solutions.main(ROOT / "solutions" / "13_compiler.ipynb", PASSED)
