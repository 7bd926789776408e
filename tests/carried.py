"""Helpers for the carried-forward tests: save the reference solutions as a learner's, then break one.

A solved exercise notebook is run as a learner runs it (from work/exercises/ of a temporary
workspace, on the course kernel), without its closing cells (those tagged "payoff"), so its
checks pass and save the reference answers in work/yours/ exactly as a learner's passes would.
That takes from seconds to a minute a chapter, and chapters 12 and 13 need the answers of 01, 02
and 06 too, so each chapter is saved once per test run (the first of xdist's workers to need it saves
it, the other waits for it) and every module gets a copy. In `make test` it is not even run again:
nbval has run the same notebook, payoff included, from the staged workspace (.learner-path), and once
every cell of it has passed, its saves there are copied (`staged_run`; tests/worker_groups.py runs a
chapter's solution notebook before its tests).

Import this module as `import carried` (never also as `tests.carried`: a second copy of the module
would keep a second set of saves).
"""

import contextlib
import fcntl
import io
import os
import shutil
from pathlib import Path

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


# make test's staged workspace, where nbval runs the solution notebooks as a learner's (read before any
# fixture sets COURSE_WORKSPACE), and the nbval cells of each one not yet passed (None once one has failed).
_STAGED = os.environ.get("COURSE_WORKSPACE")
_PENDING = {}
RAN = ".solutions-ran"    # a file per chapter whose staged solution notebook passed every cell


def expect_solution_runs(items):
    """Note the nbval cells of the staged solution notebooks among the collected items."""
    if not _STAGED:
        return
    folder = (Path(_STAGED) / "exercises").resolve()
    for item in items:
        if item.path.suffix == ".ipynb" and item.path.resolve().parent == folder:
            _PENDING.setdefault(item.path.name[:2], set()).add(item.nodeid)


def solution_cell_ran(report):
    """Called with every test report: once a staged solution notebook has passed every cell in this process,
    mark it in the staged workspace, for every worker to see."""
    for chapter, cells in _PENDING.items():
        if cells and report.nodeid in cells:
            if report.failed:
                _PENDING[chapter] = None
            elif report.when == "call" or report.skipped:
                cells.discard(report.nodeid)
                if not cells:
                    (Path(_STAGED) / RAN).mkdir(exist_ok=True)
                    (Path(_STAGED) / RAN / chapter).touch()
            return


class SolutionRuns:
    """The pytest plugin that follows the staged solution notebooks' cells (registered by conftest.py)."""

    def pytest_runtest_logreport(self, report):
        solution_cell_ran(report)


def staged_run(chapter):
    """The workspace where nbval ran solutions/NN, unchanged, to the end with every cell passing (its checks
    saved the answers there as a learner's passes do), or None."""
    if not _STAGED:
        return None
    staged = Path(_STAGED)
    notebook = staged / "exercises" / solution_notebook(chapter).name
    if (staged / RAN / chapter).exists() and notebook.is_file() and \
            notebook.read_bytes() == solution_notebook(chapter).read_bytes():
        return staged
    return None


# Each chapter's reference answers are saved once per test run, in a folder all of xdist's workers share
# (the parent of their temporary folders), under a lock; a process keeps the folders it has used here.
_SAVED = {}


def _shared_folder(tmp_path_factory):
    """A folder of this test run that every xdist worker sees (its own temporary folder without xdist)."""
    base = tmp_path_factory.getbasetemp()
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    folder = base.parent / f"carried-{run}" if run and os.environ.get("PYTEST_XDIST_WORKER") else base / "carried"
    folder.mkdir(exist_ok=True)
    return folder


@contextlib.contextmanager
def _locked(path):
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)     # the other worker waits here while this one saves
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _saved_once(tmp_path_factory, chapter):
    """The workspace where chapter NN's reference answers were saved, made by the first process to ask."""
    if chapter not in _SAVED:
        shared = _shared_folder(tmp_path_factory)
        work, done = shared / f"saved{chapter}" / "work", shared / f"saved{chapter}.done"
        with _locked(shared / f"saved{chapter}.lock"):
            if not done.exists():
                shutil.rmtree(work, ignore_errors=True)
                with pytest.MonkeyPatch.context() as mp:
                    mp.setenv("COURSE_WORKSPACE", str(work))
                    mp.delenv("COURSE_PROGRESS_FILE", raising=False)
                    if staged := staged_run(chapter):
                        (work / "yours").mkdir(parents=True)
                        for name in (f"ch{chapter}.py", f"ch{chapter}.json"):
                            shutil.copy(staged / "yours" / name, work / "yours" / name)
                        assert answers.index(chapter), f"chapter {chapter}'s staged run saved nothing"
                    else:
                        save_reference(chapter, work)
                others = [p.name for p in (work / "yours").glob("ch*.*") if not p.name.startswith(f"ch{chapter}.")]
                assert not others, f"chapter {chapter}'s notebook saved other chapters' files too, {others}: " \
                                   "the chapters' saves can no longer be copied together; save them into one workspace"
                done.touch()
        _SAVED[chapter] = work
    return _SAVED[chapter]


def saved_workspace(tmp_path_factory, *chapters, save=None):
    """A new workspace where the reference answers of `chapters` were saved as a learner's, each in its own
    work/yours/chNN.py: copied from the run's saves (see `_saved_once`), or made by `save(work)` for a
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
