"""The learner's workspace: copies, updates that never clobber edits, resets with backups,
and the `course` commands that read it."""

import json
import linecache
import shutil

import nbformat
import pytest

from course_lib import REPO_DIR
from course_lib.course import commands, environment, printing
from course_lib.course.workspace import copies, mirror, reset, stage, sync
from course_lib.learner import progress


@pytest.fixture
def repo(tmp_path):
    """A tiny course repo with one lesson and one exercise notebook."""
    root = tmp_path / "repo"
    for kind in ("notebooks", "exercises"):
        (root / kind).mkdir(parents=True)
    shutil.copy(REPO_DIR / "notebooks/00_welcome.ipynb", root / "notebooks/00_welcome.ipynb")
    shutil.copy(REPO_DIR / "exercises/00_warmup.ipynb", root / "exercises/00_warmup.ipynb")
    return root


def _edit(path, change):
    """Change a notebook as JupyterLab would save it: read, change, write."""
    nb = nbformat.read(str(path), as_version=4)
    change(nb)
    nbformat.write(nb, str(path))


def _course_changes(repo, name, old, new):
    p = repo / name
    p.write_text(p.read_text().replace(old, new, 1))


def test_sync_lifecycle(repo, workspace):
    report = dict((str(p.relative_to(workspace)), what) for what, p in sync.sync(repo))
    assert report == {"notebooks/00_welcome.ipynb": "added", "exercises/00_warmup.ipynb": "added"}
    assert sync.sync(repo) == []  # nothing new

    # The course updates both notebooks; the learner filled in an exercise cell the course did not change.
    mine = workspace / "exercises/00_warmup.ipynb"
    mine.write_text(mine.read_text().replace("YOUR CODE HERE", "my answer", 1))
    _course_changes(repo, "notebooks/00_welcome.ipynb", "Welcome", "Welcome (updated)")
    _course_changes(repo, "exercises/00_warmup.ipynb", "Exercise", "Exercise (updated)")
    report = {str(p.relative_to(workspace)): what for what, p in sync.sync(repo)}
    assert report["notebooks/00_welcome.ipynb"] == "updated"
    assert report["exercises/00_warmup.ipynb"].startswith("updated, with your 1 edited or added cell(s) kept"), report
    assert "my answer" in mine.read_text() and "Exercise (updated)" in mine.read_text()
    assert "(updated)" in (workspace / "notebooks/00_welcome.ipynb").read_text()
    assert list((workspace / "backups").glob("00_warmup.*.ipynb")), "a merge must back the learner's copy up first"
    assert sync.sync(repo) == []


def test_opening_or_running_a_lesson_is_not_editing_it(repo, workspace):
    """JupyterLab rewrites metadata on open and outputs on run: the copy still takes course updates,
    and keeps the learner's outputs of every cell the course did not change."""
    sync.sync(repo)
    lesson = workspace / "notebooks/00_welcome.ipynb"

    def opened_and_ran(nb):
        nb.metadata["kernelspec"]["display_name"] = "Some other kernel"
        nb.metadata["language_info"]["version"] = "3.12.9"
        for c in nb.cells:
            if c.cell_type == "code":
                c.outputs = [nbformat.v4.new_output("stream", text="the learner's own run\n")]
    _edit(lesson, opened_and_ran)
    first_code = next(c for c in nbformat.read(str(lesson), as_version=4).cells if c.cell_type == "code")
    _course_changes(repo, "notebooks/00_welcome.ipynb", "Welcome", "Welcome (updated)")
    report = {str(p.relative_to(workspace)): what for what, p in sync.sync(repo)}
    assert report == {"notebooks/00_welcome.ipynb": "updated"}
    nb = nbformat.read(str(lesson), as_version=4)
    assert "Welcome (updated)" in "".join(c.source for c in nb.cells)
    kept = next(c for c in nb.cells if c.get("id") == first_code.get("id"))
    assert kept.outputs[0]["text"] == "the learner's own run\n", "outputs of unchanged cells are the learner's"
    assert not (workspace / "backups").exists()


def test_sync_merges_added_and_deleted_cells_and_stops_on_a_conflict(repo, workspace):
    sync.sync(repo)
    mine = workspace / "exercises/00_warmup.ipynb"
    nb = nbformat.read(str(mine), as_version=4)
    solution = next(i for i, c in enumerate(nb.cells) if "YOUR CODE HERE" in c.source)
    after = nb.cells[solution].get("id")

    def add_a_scratch_cell(nb):
        scratch = nbformat.v4.new_code_cell("print('my scratch work')")
        nb.cells.insert(solution + 1, scratch)
    _edit(mine, add_a_scratch_cell)
    _course_changes(repo, "exercises/00_warmup.ipynb", "Exercise", "Exercise (updated)")
    report = [what for what, _ in sync.sync(repo)]
    assert report and report[0].startswith("updated, with your 1 edited"), report
    merged = nbformat.read(str(mine), as_version=4)
    at = [c.get("id") for c in merged.cells].index(after)
    assert merged.cells[at + 1].source == "print('my scratch work')", "a learner's cell stays where they put it"

    # the course and the learner change the same cell: nothing is overwritten
    mine.write_text(mine.read_text().replace("YOUR CODE HERE", "my answer"))
    _course_changes(repo, "exercises/00_warmup.ipynb", "YOUR CODE HERE", "YOUR CODE HERE (about 3 lines)")
    before = mine.read_bytes()
    report = [what for what, _ in sync.sync(repo)]
    assert report[0].startswith("kept your edited copy: the course changed 1 cell(s) that you changed too"), report
    assert "course reset 00" in report[0]
    assert mine.read_bytes() == before


def test_sync_upgrades_a_workspace_of_an_older_course(repo, workspace):
    """An older course kept only each copy's bytes hash: an opened-only copy still takes the update."""
    sync.sync(repo)
    state = json.loads((workspace / ".sync.json").read_text())
    (workspace / ".sync.json").write_text(json.dumps({k: v["sha"] for k, v in state.items()}))
    assert sync.sync(repo) == []
    assert all(isinstance(v, dict) for v in json.loads((workspace / ".sync.json").read_text()).values())


def test_reset_backs_up_and_never_overwrites_backups(repo, workspace):
    sync.sync(repo)
    mine = workspace / "exercises/00_warmup.ipynb"
    mine.write_text(mine.read_text().replace("YOUR CODE HERE", "attempt one"))
    first = reset.reset("00", repo=repo)
    mine.write_text(mine.read_text().replace("YOUR CODE HERE", "attempt two"))
    second = reset.reset("0", repo=repo)
    assert first != second and first.exists() and second.exists()
    assert "attempt one" in first.read_text() and "attempt two" in second.read_text()
    assert mine.read_bytes() == (repo / "exercises/00_warmup.ipynb").read_bytes()


def test_course_check_reports_each_check(workspace, capsys):
    """`course check` on a filled-in copy passes everything and records progress; untouched fails."""
    (workspace / "exercises").mkdir(parents=True)
    shutil.copy(REPO_DIR / "solutions/00_warmup.ipynb", workspace / "exercises/00_warmup.ipynb")
    assert commands.main(["check", "00"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # lines wrapped to the terminal's width
    assert out.count("passed") >= 3 and "3 of 3 checks passed" in out
    assert all(r["passed"] for r in progress.load()["00"].values())

    commands.main(["reset", "00"])
    assert commands.main(["check", "00"]) == 1
    assert "0 of 3 checks passed" in " ".join(capsys.readouterr().out.split())
    assert not any(r["passed"] for r in progress.load()["00"].values())
    assert list((workspace / "backups").glob("00_warmup.*.ipynb"))

    commands.main(["status"])
    out = capsys.readouterr().out
    assert "00_warmup" in out and "failed" in out and "numerical_gradient" in out


def test_course_check_reports_progress_and_skips_the_payoff_after_a_failure(workspace, capsys):
    """Each check's line appears as it finishes; once one has failed the closing (payoff) cells are not
    run; a pass says where the code was kept."""
    (workspace / "exercises").mkdir(parents=True)
    for source, expect_ran in (("solutions", True), ("exercises", False)):
        nb = nbformat.read(str(REPO_DIR / source / "00_warmup.ipynb"), as_version=4)
        payoff = nbformat.v4.new_code_cell("open('payoff-ran', 'w').close()")
        payoff.metadata["tags"] = ["payoff"]
        nb.cells.append(payoff)
        nbformat.write(nb, str(workspace / "exercises/00_warmup.ipynb"))
        marker = workspace / "exercises/payoff-ran"
        marker.unlink(missing_ok=True)
        commands.main(["check", "00"])
        out = capsys.readouterr().out
        assert "[1/3]" in out and "[3/3]" in out, out
        assert marker.exists() == expect_ran, f"payoff {'not ' if expect_ran else ''}run from {source}"
    assert "closing cells were skipped" in " ".join(out.split())


def test_pass_line_says_where_the_code_is_kept(workspace, monkeypatch, capsys):
    from course_lib.checks import ch00
    from course_lib.learner import answers

    monkeypatch.setenv("COURSE_PROGRESS_FILE", str(workspace / "progress.json"))
    source = "def numerical_derivative(f, x, h=1e-5):\n    return (f(x + h) - f(x - h)) / (2 * h)\n"
    linecache.cache["<a notebook cell>"] = (len(source), None, source.splitlines(True), "<a notebook cell>")
    ns = {"__name__": "__main__"}  # as if defined in the learner's notebook
    exec(compile(source, "<a notebook cell>", "exec"), ns)
    ch00.numerical_derivative(ns["numerical_derivative"])
    out = capsys.readouterr().out
    assert "passed" in out and "; kept in work/yours/ch00.py" in out, out
    assert answers.used_by("02") == ", which the closing cells of chapters 02, 06, 12 and 13 run"
    assert answers.used_by("12") == ", which the closing cells of chapters 12 and 13 run"


def test_messages_are_wrapped_whole(workspace, capsys, monkeypatch):
    """`course status` and `course check` wrap long messages at word boundaries and never cut them;
    the status table is as wide as its longest exercise name."""
    long = ("not implemented yet: replace the `raise NotImplementedError` line in the exercise cell with "
            "your code, then run the check cell again; words like eliminate_common_subexpressions stay whole")
    text = printing.wrap(long, "    ")
    assert " ".join(text.split()) == " ".join(long.split()), "no word lost or cut"
    assert all(len(line) <= max(60, shutil.get_terminal_size((100, 24)).columns) for line in text.splitlines())
    monkeypatch.setattr(progress, "load", lambda: {"03": {"eliminate_common_subexpressions": {
        "passed": False, "message": long, "time": ""}}})
    commands.main(["status"])
    out = capsys.readouterr().out
    assert "eliminate_common_subexpressions" in out and "words like" in out.replace("\n", " ")
    rows = [line for line in out.splitlines() if "not started" in line or "failed" in line]
    status_at = {line.index("course's") for line in rows if "course's" in line}
    assert len(status_at) == 1, "the 'code used' column is not aligned:\n" + out


def test_status_lists_unstarted_exercises(workspace, capsys):
    commands.main(["status"])
    out = capsys.readouterr().out
    assert "not started" in out and "gradient_check" in out


def test_course_check_prints_no_kernel_warning(workspace, capfd):
    """The headless kernel talks TCP, encrypted where ZeroMQ can: no plain-TCP warning reaches the learner."""
    (workspace / "exercises").mkdir(parents=True)
    shutil.copy(REPO_DIR / "exercises/00_warmup.ipynb", workspace / "exercises/00_warmup.ipynb")
    assert commands.main(["check", "00"]) == 1
    out, err = capfd.readouterr()
    assert "checks passed" in out
    assert "WARNING" not in out + err and "encryption" not in out + err, err[-2000:]


def test_library_mirror_is_readable_and_follows_the_course(repo, workspace):
    """work/course_lib holds a read-only copy of the library that sync refreshes."""
    lib = repo / "course_lib"
    (lib / "pkg").mkdir(parents=True)
    (lib / "pkg/one.py").write_text("ONE = 1\n")
    (lib / "gone.py").write_text("GONE = 1\n")
    mirror.mirror_library(repo)
    copy = workspace / "course_lib"
    assert (copy / "pkg/one.py").read_text() == "ONE = 1\n"
    assert "read-only" in (copy / "README.md").read_text()
    assert not (copy / "pkg/one.py").stat().st_mode & 0o222, "the copy should be read-only"
    (lib / "pkg/one.py").write_text("ONE = 2\n")
    (lib / "gone.py").unlink()
    mirror.mirror_library(repo)
    assert (copy / "pkg/one.py").read_text() == "ONE = 2\n" and not (copy / "gone.py").exists()
    assert not (workspace / "exercises").exists(), "mirroring touches nothing but its own folders"


def test_benchmarks_the_lessons_cite_are_readable_from_work(workspace):
    """Lessons cite benchmarks/ and RESULTS.md: JupyterLab, which serves work/, must show them."""
    mirror.mirror_library()
    copy = workspace / "benchmarks"
    assert (copy / "RESULTS.md").read_text() == (REPO_DIR / "benchmarks/RESULTS.md").read_text()
    assert (copy / "ch05_scan.py").exists() and not (copy / "ch05_scan.py").stat().st_mode & 0o222
    assert "read-only" in (copy / "README.md").read_text()


def test_stage_holds_lessons_and_solved_exercises(tmp_path):
    staged = stage.stage(tmp_path / "stage")
    lessons = sorted(p.name for p in (staged / "notebooks").glob("*.ipynb"))
    solved = sorted(p.name for p in (staged / "exercises").glob("*.ipynb"))
    assert lessons == sorted(p.name for p in (REPO_DIR / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert solved == sorted(p.name for p in (REPO_DIR / "solutions").glob("[0-9][0-9]_*.ipynb"))
    assert (staged / "exercises" / solved[0]).read_bytes() == (REPO_DIR / "solutions" / solved[0]).read_bytes()


def test_lab_settings_silence_the_news_prompt(monkeypatch, tmp_path):
    monkeypatch.setattr(commands.sys, "prefix", str(tmp_path))
    environment.install_lab_settings()
    settings = json.loads((tmp_path / "share/jupyter/lab/settings/overrides.json").read_text())
    assert settings["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"


def _lab_overwrites(path, old_bytes):
    """What JupyterLab's "Overwrite" writes: the tab's text from before the update (outputs and all)."""
    path.write_bytes(old_bytes)


def test_an_update_a_save_wrote_over_comes_back(repo, workspace):
    """A lesson open in JupyterLab during a sync: the learner's save writes the older text back. The
    next sync sees that the cells the update changed are back at their old text, and merges the
    update in again; then nothing more to do, and a copy that still has the update is left alone."""
    sync.sync(repo)
    lesson = workspace / "notebooks/00_welcome.ipynb"
    opened = lesson.read_bytes()
    _course_changes(repo, "notebooks/00_welcome.ipynb", "Welcome", "Welcome (updated)")
    assert [what for what, _ in sync.sync(repo)] == ["updated"]
    _lab_overwrites(lesson, opened)
    report = [what for what, _ in sync.sync(repo)]
    assert len(report) == 1 and report[0].startswith("updated again (your copy had lost the course's last update"), report
    assert "Welcome (updated)" in lesson.read_text()
    assert sync.sync(repo) == []

    def run_it(nb):  # the learner runs the updated lesson: still the update's text, nothing to restore
        for c in nb.cells:
            if c.cell_type == "code":
                c.outputs = [nbformat.v4.new_output("stream", text="ran\n")]
    _edit(lesson, run_it)
    assert sync.sync(repo) == []


def test_an_update_a_save_wrote_over_comes_back_with_the_learners_edits(repo, workspace):
    """The stale tab held the learner's answer too: the update comes back, the answer stays, and the
    copy as the save left it is backed up first."""
    sync.sync(repo)
    mine = workspace / "exercises/00_warmup.ipynb"
    _course_changes(repo, "exercises/00_warmup.ipynb", "Exercise", "Exercise (updated)")
    stale = mine.read_text().replace("YOUR CODE HERE", "my answer", 1)
    sync.sync(repo)
    mine.write_text(stale)  # the tab opened before the sync, with the answer typed in it, saved over the update
    report = [what for what, _ in sync.sync(repo)]
    assert report[0].startswith("updated again") and "edited or added cell(s) kept" in report[0], report
    assert "my answer" in mine.read_text() and "Exercise (updated)" in mine.read_text()
    assert any("my answer" in p.read_text() for p in (workspace / "backups").glob("00_warmup.*.ipynb"))


def test_synced_copies_are_trusted_by_jupyterlab(repo, workspace):
    """Every notebook sync or reset writes is signed with the notary `course lab` points JupyterLab at,
    so its saved outputs (SVG graphs) show on opening and the server logs no "not trusted"."""
    from nbformat.sign import NotebookNotary

    sync.sync(repo)
    reset.reset("00", repo=repo)
    notary = NotebookNotary(data_dir=str(copies.trust_dir()))
    for path in (workspace / "notebooks/00_welcome.ipynb", workspace / "exercises/00_warmup.ipynb"):
        assert notary.check_signature(nbformat.read(str(path), as_version=4)), path
    edited = nbformat.read(str(workspace / "exercises/00_warmup.ipynb"), as_version=4)
    edited.cells[0].source += "\nsomething else"
    assert not notary.check_signature(edited), "a signature must cover the notebook's content"
    notary.store.close()
