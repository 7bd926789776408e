"""The reference solutions of chapter 10's kernel exercises, as a module, for the benchmarks' --solutions mode.

    kernels = solution_kernels()      # {"fused_scan": ..., "flash_forward": ..., "flash_backward": ...}

The solved notebook (solutions/10_fused_kernels.ipynb) holds the kernels a learner who writes them well
ends up with. This takes its set-up cell and the cells that define the three CPU kernels, writes them to
a module in a temporary folder (Numba caches compiled code next to a real file, not for text run with
`exec`), and imports it. Nothing here runs a check: the notebook's nbval run does that.
"""

import importlib.util
import sys
import tempfile
from pathlib import Path

import nbformat

from course_lib import REPO_DIR

NAMES = ("fused_scan", "flash_forward", "flash_backward")


def solution_source():
    """The imports of the solved notebook and the source of its three CPU kernels, as one module."""
    nb = nbformat.read(REPO_DIR / "solutions" / "10_fused_kernels.ipynb", as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    imports = next(s for s in code if "from course_lib.simd.tiles import" in s)
    kernels = [s for s in code if any(f"def {name}(" in s for name in NAMES)]
    lines = "\n".join([imports, *kernels]).splitlines()
    return "\n".join(line for line in lines if "### " not in line) + "\n"


def solution_kernels():
    """{name: the solution's kernel}, imported from a module written to a temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix="ch10_solutions_"))
    path = folder / "ch10_solution_kernels.py"
    path.write_text(solution_source())
    spec = importlib.util.spec_from_file_location("ch10_solution_kernels", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return {name: getattr(module, name) for name in NAMES}
