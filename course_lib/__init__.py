"""course_lib: the shared code of the course *Deep learning systems from scratch*.

Each chapter's reference implementation lives in its own subpackage: autograd (01), tensor (02),
graph (03), gpt (04), mamba (05), fast (06), cuda (07), custom_ops (08), infer (09), fused (10, its
building blocks in simd), distributed (11), capstone (12), compiler (13) and serve (14). `course_lib.yours`
assembles the learner's own saved pieces into working parts for later chapters, and `course_lib.learner`
keeps the course's record of the learner (progress, saved answers). `course_lib.course` is the course's
tooling, not teaching code: the `course` command, JupyterLab's setup, the learner's workspace, and how
notebooks are built and run. The helpers every chapter uses are:

- `course_lib.checks`  the exercise checks and the toolkit they are written with
- `course_lib.gradcheck` numerical derivatives and gradient checks (the course's answers to chapter 00's
  exercises: read them once your checks pass)
- `course_lib.viz`     graph drawings (graphviz) and training curves (matplotlib)
- `course_lib.data`    offline data: two moons, scikit-learn digits, a text corpus
- `course_lib.device`  GPU detection and Numba's CUDA simulator
- `course_lib.timing`  timing that interleaves contestants; `course_lib.memory` the peak bytes a call allocates
"""

from pathlib import Path

__version__ = "0.1.0"

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
CHECKOUT = (REPO_DIR / "pyproject.toml").is_file() and (REPO_DIR / "solutions").is_dir()
"""True when the library runs from the course's folder (a clone), False when pip installed it: then
REPO_DIR is only site-packages, the lessons' files come from `course_lib.course.resources`, and the commands
that read the course's notebooks say that they need a local setup."""
