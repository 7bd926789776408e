"""course_lib: the shared code of the course *Deep learning systems from scratch*.

Each chapter's reference implementation lives in its own subpackage (autograd, tensor,
graph, gpt, mamba, fast, cuda, custom_ops, infer, fused, distributed, capstone), and `course_lib.yours`
assembles the learner's own saved pieces into working parts for later chapters. The helpers every chapter uses are:

- `course_lib.checks`  the exercise checks and the toolkit they are written with
- `course_lib.viz`     graph drawings (graphviz) and training curves (matplotlib)
- `course_lib.data`    offline data: two moons, scikit-learn digits, a text corpus
- `course_lib.device`  GPU detection and Numba's CUDA simulator
"""

from pathlib import Path

__version__ = "0.1.0"

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
