"""Your code, carried forward: a passing check saves the learner's code in work/yours/, a failing
one never replaces it, and a later chapter gets the learner's pieces or, visibly, the course's."""

import functools

import nbformat
import pytest

from course_lib import REPO_DIR, yours
from course_lib.checks import CheckFailed
from course_lib.course import commands, nbtools
from course_lib.learner import answers

SETUP = "from course_lib.checks import ch00 as check\nTWO = 2"
GOOD = ("class Spread:\n    def __call__(self, f, x, h):\n        return f(x + h) - f(x - h)\n\n\n"
        "spread = Spread()\n\n\n"
        "def numerical_derivative(f, x, h=1e-5):\n    return Spread()(f, x, h) / (TWO * h)")
WRONG = "def numerical_derivative(f, x, h=1e-5):\n    return (f(x + h) - f(x)) / h"
CHECK = "check.numerical_derivative(numerical_derivative)"


def run_in_exercises(workspace, *cells):
    """Execute cells as the learner's exercise notebook 00 does: from work/exercises, on the kernel."""
    folder = workspace / "exercises"
    folder.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    return nbtools.execute(nb, cwd=folder, allow_errors=True)


def errors(nb):
    return [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]


def snapshot(root):
    return {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def test_pass_saves_fail_keeps_and_a_wrong_piece_is_named(workspace, tmp_path, capsys):
    repo_work = snapshot(REPO_DIR / "work") if (REPO_DIR / "work").exists() else {}
    nb = run_in_exercises(workspace, SETUP, GOOD, CHECK)
    assert not errors(nb)
    assert "could not be saved" not in str(nb.cells[-1].outputs)
    commands.main(["status"])
    row = next(line for line in capsys.readouterr().out.splitlines() if "numerical_derivative" in line)
    assert "yours" in row and "passed" in row
    saved = answers.module_path("00")
    text = saved.read_text()
    assert "class Spread:" in text and "def numerical_derivative(" in text and "TWO = 2" in text
    assert text.index("class Spread:") < text.index("def numerical_derivative(")

    # A failing attempt leaves the saved pass alone.
    nb = run_in_exercises(workspace, SETUP, WRONG, CHECK)
    assert errors(nb) and errors(nb)[0].ename == "CheckFailed"
    assert saved.read_text() == text

    # A later chapter gets the learner's piece, and says so.
    def reference(f, x, h=1e-5):
        return (f(x + h) - f(x - h)) / (2 * h)

    chosen = yours.pieces("00", {"numerical_derivative": reference, "numerical_gradient": reference})
    assert chosen["numerical_derivative"] is not reference
    assert chosen["numerical_derivative"].__module__ == "course_yours_ch00"
    assert chosen["numerical_gradient"] is reference
    yours.use("00", False)
    try:
        assert yours.pieces("00", {"numerical_derivative": reference}, quiet=True)["numerical_derivative"] is reference
    finally:
        yours.use("00", True)

    # A piece that no longer passes stops the later chapter at once, named.
    saved.write_text(text.replace("(TWO * h)", "h"))
    with pytest.raises(CheckFailed, match="your saved `numerical_derivative`"):
        yours.pieces("00", {"numerical_derivative": reference})

    # A new pass replaces the module and backs the old one up; nothing outside work/ changed.
    nb = run_in_exercises(workspace, SETUP, GOOD.replace("TWO * h", "2 * h"), CHECK)
    assert not errors(nb)
    assert "(2 * h)" in saved.read_text() and list((workspace / "backups").glob("ch00.*.py"))
    assert (snapshot(REPO_DIR / "work") if (REPO_DIR / "work").exists() else {}) == repo_work
    assert saved.is_relative_to(workspace)
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_relative_to(workspace)]
    assert not outside, outside


def test_lessons_and_solutions_save_nothing(workspace):
    """Only the learner's exercise notebooks save: a lesson's or a test's check does not."""
    (workspace / "notebooks").mkdir(parents=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in (SETUP, GOOD, CHECK)])
    assert not errors(nbtools.execute(nb, cwd=workspace / "notebooks", allow_errors=True))
    assert not (workspace / "yours").exists()


def test_capture_takes_what_a_function_reads_from_outside_not_its_locals():
    from course_lib.learner.capture import names_used

    source = "def f(a, b=K):\n    s = a + TWO\n    for i in range(3):\n        s += i\n    return s, np.sum(a)"
    assert names_used(source) == {"K", "TWO", "range", "np"}


def _decorate(f):
    @functools.wraps(f)
    def wrapper(*args):
        return f(*args)
    return wrapper


@_decorate
def _decorated(x):
    return TWO_HERE * x


TWO_HERE = 2


def test_capture_sees_through_a_decorator():
    """A notebook function under a decorator (@torch.no_grad(), say) is captured with the notebook's
    globals, not with those of the decorator's module."""
    from course_lib.learner.capture import defined_here

    inner = defined_here(_decorated, module=__name__)
    assert inner is _decorated.__wrapped__ and inner.__globals__["TWO_HERE"] == 2
