"""The exercise pipeline: exercises/ is generated from solutions/, and its checks are honest.

nbval (run by `make test` over notebooks/ and solutions/) proves every check passes on the
reference answers. Here we prove the converse: run each exercise notebook untouched, and
every check cell must fail with CheckFailed (the idea of nbgrader's `validate --invert`).
"""

import pytest

from course_lib import REPO_DIR
from course_lib.course import exercises, nbtools

EXERCISES = sorted((REPO_DIR / "exercises").glob("[0-9][0-9]_*.ipynb"))


def test_exercises_are_up_to_date():
    stale = exercises.build(check_only=True)
    assert not stale, f"exercises/ is out of date with solutions/: {[p.name for p in stale]}; run `course build`"


@pytest.mark.parametrize("solution", exercises.pairs(), ids=lambda p: p[0].stem if isinstance(p, tuple) else p)
def test_solution_notebook_follows_conventions(solution):
    sol, _ = solution
    nb = nbtools.read(sol)
    assert nb.cells and exercises.check_names(nb), f"{sol.name} has no check cells"
    assert not exercises.lint(nb), f"{sol.name}: " + "; ".join(exercises.lint(nb))


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.stem)
def test_untouched_exercises_fail_every_check(path):
    nb = nbtools.read(path)
    # the payoff cells would only rerun the course's pieces (nothing is saved here): nbval runs them on
    # the solutions, and tests/test_yours_chNN.py on saved and broken pieces
    nb.cells = [c for c in nb.cells if "payoff" not in c.metadata.get("tags", [])]
    nb = nbtools.execute(nb, cwd=path.parent, timeout=300, allow_errors=True)
    checks = [c for c in nb.cells if exercises.is_check(c)]
    assert checks, f"{path.name} has no check cells"
    for cell in nb.cells:
        if exercises.is_exercise(cell):
            break
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        assert not errors, f"{path.name}: a set-up cell failed before the first exercise:\n{cell.source}\n{errors[0].evalue}"
    for cell in checks:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert errors, f"{path.name}: this check PASSED on the untouched stub, so it cannot tell:\n{cell.source}"
        assert errors[0].ename == "CheckFailed", (
            f"{path.name}: this check failed with {errors[0].ename} instead of CheckFailed, so the learner "
            f"sees a bare traceback:\n{cell.source}\n{errors[0].evalue}")
