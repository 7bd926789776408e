"""Helpers for the carried-forward tests: save the reference solutions as a learner's, then break one.

A solved exercise notebook is run as a learner runs it (from work/exercises/ of a temporary
workspace, on the course kernel), without its closing cells (those tagged "payoff"), so its
checks pass and save the reference answers in work/yours/ exactly as a learner's passes would.
"""

import contextlib
import io
import shutil

import nbformat
import pytest

from course_lib import REPO_DIR, nbtools
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


def saved_workspace(tmp_path_factory, chapter, save=None):
    """A workspace, made once per test module, where chapter NN's reference answers were saved as a
    learner's: by `save_reference`, or by `save(work)` for a chapter that saves only some exercises."""
    work = tmp_path_factory.mktemp(f"ch{chapter}") / "work"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COURSE_WORKSPACE", str(work))
        mp.delenv("COURSE_PROGRESS_FILE", raising=False)
        save(work) if save else save_reference(chapter, work)
    return work


def fixtures(chapter, save=None):
    """The two fixtures of a carried-forward test module, for chapter NN:

        saved, learner = carried.fixtures("01")

    saved    (made once per module) a workspace where the reference answers were saved as a learner's;
    learner  a copy of it made the current workspace for one test, which may break a piece in it."""

    @pytest.fixture(scope="module")
    def saved(tmp_path_factory):
        return saved_workspace(tmp_path_factory, chapter, save)

    @pytest.fixture
    def learner(saved, tmp_path, monkeypatch):
        work = tmp_path / "work"
        shutil.copytree(saved, work)
        monkeypatch.setenv("COURSE_WORKSPACE", str(work))
        monkeypatch.delenv("COURSE_PROGRESS_FILE", raising=False)
        return work

    return saved, learner


def run_payoff(chapter, namespace=None):
    """Run the solved notebook's payoff cells in this process; return (namespace, printed text)."""
    namespace = {} if namespace is None else namespace
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for source in payoff_cells(chapter):
            exec(compile(source, "<payoff>", "exec"), namespace)
    return namespace, out.getvalue()
