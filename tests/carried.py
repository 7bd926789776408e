"""Helpers for the carried-forward tests: save the reference solutions as a learner's, then break one.

A solved exercise notebook is run as a learner runs it (from work/exercises/ of a temporary
workspace, on the course kernel), without its closing cells (those tagged "payoff"), so its
checks pass and save the reference answers in work/yours/ exactly as a learner's passes would.
That takes from seconds to a minute a chapter, and chapters 12 and 13 need the answers of 01, 02
and 06 too, so each chapter is saved once per test process and every module gets a copy.

Import this module as `import carried` (never also as `tests.carried`: a second copy of the module
would keep a second set of saves).
"""

import contextlib
import io
import shutil

import nbformat
import pytest

from course_lib import REPO_DIR, yours
from course_lib.course import nbtools
from course_lib.learner import answers


def solution_notebook(chapter):
    return next((REPO_DIR / "solutions").glob(f"{chapter}_*.ipynb"))


def save_reference(chapter, workspace, drop_payoff=True):
    """Run solutions/NN (minus its payoff cells) from workspace/exercises; return the executed notebook."""
    nb = nbformat.read(solution_notebook(chapter), as_version=4)
    if drop_payoff:
        nb.cells = [c for c in nb.cells if "payoff" not in c.metadata.get("tags", [])]
    folder = workspace / "exercises"
    folder.mkdir(parents=True, exist_ok=True)
    nb = nbtools.execute(nb, cwd=folder, allow_errors=True)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, f"the reference solutions of chapter {chapter} failed: {errors[0].ename}: {errors[0].evalue}"
    assert answers.index(chapter), f"chapter {chapter}'s checks passed but saved nothing in {answers.folder()}"
    return nb


def break_piece(chapter, exercise, old, new):
    """Replace `old` with `new` in the saved source of one exercise (a wrong piece, as if saved by a pass)."""
    pieces = answers.index(chapter)
    source = pieces[exercise]["source"]
    assert old in source, f"{old!r} is not in the saved {exercise}:\n{source}"
    answers.save(chapter, exercise, pieces[exercise]["names"], source.replace(old, new, 1), pieces[exercise].get("constants"))


def payoff_cells(chapter):
    """The source of the solved notebook's payoff cells, in order."""
    nb = nbformat.read(solution_notebook(chapter), as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code" and "payoff" in c.metadata.get("tags", [])]


# Each chapter's reference answers are saved once per test process (a pytest session, or one xdist worker)
# and kept here; a test module gets its own copy, and a test that may break a piece a copy of that.
_SAVED = {}


def _saved_once(tmp_path_factory, chapter):
    """The workspace where chapter NN's reference answers were saved, made on first use in this process."""
    if chapter not in _SAVED:
        work = tmp_path_factory.mktemp(f"saved{chapter}") / "work"
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("COURSE_WORKSPACE", str(work))
            mp.delenv("COURSE_PROGRESS_FILE", raising=False)
            save_reference(chapter, work)
        others = [p.name for p in (work / "yours").glob("ch*.*") if not p.name.startswith(f"ch{chapter}.")]
        assert not others, f"chapter {chapter}'s notebook saved other chapters' files too, {others}: " \
                           "the chapters' saves can no longer be copied together; save them into one workspace"
        _SAVED[chapter] = work
    return _SAVED[chapter]


def saved_workspace(tmp_path_factory, *chapters, save=None):
    """A new workspace where the reference answers of `chapters` were saved as a learner's, each in its own
    work/yours/chNN.py: copied from the process's saves (see `_saved_once`), or made by `save(work)` for a
    chapter that saves only some exercises."""
    work = tmp_path_factory.mktemp(f"ch{'-'.join(chapters)}") / "work"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COURSE_WORKSPACE", str(work))
        mp.delenv("COURSE_PROGRESS_FILE", raising=False)
        if save:
            save(work)
        else:
            for chapter in chapters:
                shutil.copytree(_saved_once(tmp_path_factory, chapter) / "yours", work / "yours", dirs_exist_ok=True)
    return work


def fixtures(*chapters, save=None):
    """The two fixtures of a carried-forward test module, for chapter NN (or chapters, all saved):

        saved, learner = carried.fixtures("01")

    saved    (one per module) a workspace where the reference answers were saved as a learner's
    learner  a copy of it made the current workspace for one test, which may break a piece in it"""

    @pytest.fixture(scope="module")
    def saved(tmp_path_factory):
        return saved_workspace(tmp_path_factory, *chapters, save=save)

    @pytest.fixture
    def learner(saved, tmp_path, monkeypatch):
        work = tmp_path / "work"
        shutil.copytree(saved, work)
        monkeypatch.setenv("COURSE_WORKSPACE", str(work))
        monkeypatch.delenv("COURSE_PROGRESS_FILE", raising=False)
        return work

    return saved, learner


def payoff_fixture(chapter):
    """A module fixture: the payoff cells run once in this process on the module's `saved` workspace,
    which stays the current workspace while the module's tests use it; gives (namespace, printed text)."""

    @pytest.fixture(scope="module")
    def payoff(saved):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("COURSE_WORKSPACE", str(saved))
            mp.delenv("COURSE_PROGRESS_FILE", raising=False)
            yield run_payoff(chapter)

    return payoff


@contextlib.contextmanager
def switched_off(chapter):
    """The course's pieces for chapter NN while the block runs (`yours.use(NN, False)`), the learner's after."""
    yours.use(chapter, False)
    try:
        yield
    finally:
        yours.use(chapter, True)


def payoff_on_a_kernel(chapter, workspace):
    """The payoff cells on a fresh kernel from workspace/exercises (as after a restart): they read work/yours,
    not the notebook. Returns (printed text, [(cell number, error output)])."""
    (workspace / "exercises").mkdir(exist_ok=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in payoff_cells(chapter)])
    nb = nbtools.execute(nb, cwd=workspace / "exercises", allow_errors=True)
    errors = [(k, o) for k, c in enumerate(nb.cells) for o in c.outputs if o.output_type == "error"]
    return "".join(o.get("text", "") for c in nb.cells for o in c.outputs), errors


def assert_payoff_stops_at_once(chapter, workspace, exercise):
    """The payoff cells on a kernel stop in their first cell, with the check of the learner's saved `exercise`;
    returns that CheckFailed's message."""
    _, errors = payoff_on_a_kernel(chapter, workspace)
    assert errors, f"chapter {chapter}'s payoff ran to the end on a wrong saved `{exercise}`"
    (cell, error), *_ = errors
    assert cell == 0 and error.ename == "CheckFailed" and f"your saved `{exercise}`" in error.evalue, \
        f"cell {cell}: {error.ename}: {error.evalue}"
    return error.evalue


def run_payoff(chapter, namespace=None):
    """Run the solved notebook's payoff cells in this process; return (namespace, printed text)."""
    namespace = {} if namespace is None else namespace
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for source in payoff_cells(chapter):
            exec(compile(source, "<payoff>", "exec"), namespace)
    return namespace, out.getvalue()
