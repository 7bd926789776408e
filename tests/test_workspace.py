"""The learner's workspace: copies, updates that never clobber edits, resets with backups,
and the `course` commands that read it."""

import json
import shutil

import pytest

from course_lib import REPO_DIR, cli, progress
from course_lib import workspace as ws


@pytest.fixture
def repo(tmp_path):
    """A tiny course repo with one lesson and one exercise notebook."""
    root = tmp_path / "repo"
    for kind in ("notebooks", "exercises"):
        (root / kind).mkdir(parents=True)
    shutil.copy(REPO_DIR / "notebooks/00_welcome.ipynb", root / "notebooks/00_welcome.ipynb")
    shutil.copy(REPO_DIR / "exercises/00_warmup.ipynb", root / "exercises/00_warmup.ipynb")
    return root


def test_sync_lifecycle(repo, workspace):
    report = dict((str(p.relative_to(workspace)), what) for what, p in ws.sync(repo))
    assert report == {"notebooks/00_welcome.ipynb": "added", "exercises/00_warmup.ipynb": "added"}
    assert ws.sync(repo) == []  # nothing new

    # The course updates both notebooks; the learner edited only the exercise copy.
    mine = workspace / "exercises/00_warmup.ipynb"
    mine.write_text(mine.read_text().replace("YOUR CODE HERE", "my answer"))
    for name, word in [("notebooks/00_welcome.ipynb", "Welcome"), ("exercises/00_warmup.ipynb", "Exercise")]:
        p = repo / name
        p.write_text(p.read_text().replace(word, word + " (updated)"))
    report = {str(p.relative_to(workspace)): what for what, p in ws.sync(repo)}
    assert report["notebooks/00_welcome.ipynb"] == "updated"
    assert report["exercises/00_warmup.ipynb"].startswith("kept your edited copy")
    assert "my answer" in mine.read_text()
    assert "(updated)" in (workspace / "notebooks/00_welcome.ipynb").read_text()


def test_reset_backs_up_and_never_overwrites_backups(repo, workspace):
    ws.sync(repo)
    mine = workspace / "exercises/00_warmup.ipynb"
    mine.write_text(mine.read_text().replace("YOUR CODE HERE", "attempt one"))
    first = ws.reset("00", repo=repo)
    mine.write_text(mine.read_text().replace("YOUR CODE HERE", "attempt two"))
    second = ws.reset("0", repo=repo)
    assert first != second and first.exists() and second.exists()
    assert "attempt one" in first.read_text() and "attempt two" in second.read_text()
    assert mine.read_bytes() == (repo / "exercises/00_warmup.ipynb").read_bytes()


def test_course_check_reports_each_check(workspace, capsys):
    """`course check` on a filled-in copy passes everything and records progress; untouched fails."""
    (workspace / "exercises").mkdir(parents=True)
    shutil.copy(REPO_DIR / "solutions/00_warmup.ipynb", workspace / "exercises/00_warmup.ipynb")
    assert cli.main(["check", "00"]) == 0
    out = capsys.readouterr().out
    assert out.count("passed") >= 3 and "3 of 3 checks passed" in out
    assert all(r["passed"] for r in progress.load()["00"].values())

    cli.main(["reset", "00"])
    assert cli.main(["check", "00"]) == 1
    assert "0 of 3 checks passed" in capsys.readouterr().out
    assert not any(r["passed"] for r in progress.load()["00"].values())
    assert list((workspace / "backups").glob("00_warmup.*.ipynb"))

    cli.main(["status"])
    out = capsys.readouterr().out
    assert "00_warmup" in out and "failed" in out and "numerical_gradient" in out


def test_status_lists_unstarted_exercises(workspace, capsys):
    cli.main(["status"])
    out = capsys.readouterr().out
    assert "not started" in out and "gradient_check" in out


def test_course_check_prints_no_kernel_warning(workspace, capfd):
    """The headless kernel talks over local sockets: no plain-TCP warning reaches the learner."""
    (workspace / "exercises").mkdir(parents=True)
    shutil.copy(REPO_DIR / "exercises/00_warmup.ipynb", workspace / "exercises/00_warmup.ipynb")
    assert cli.main(["check", "00"]) == 1
    out, err = capfd.readouterr()
    assert "checks passed" in out
    assert "WARNING" not in out + err and "encryption" not in out + err, err[-2000:]


def test_library_mirror_is_readable_and_follows_the_course(repo, workspace):
    """work/course_lib holds a read-only copy of the library that sync refreshes."""
    lib = repo / "course_lib"
    (lib / "pkg").mkdir(parents=True)
    (lib / "pkg/one.py").write_text("ONE = 1\n")
    (lib / "gone.py").write_text("GONE = 1\n")
    ws.mirror_library(repo)
    copy = workspace / "course_lib"
    assert (copy / "pkg/one.py").read_text() == "ONE = 1\n"
    assert "read-only" in (copy / "README.md").read_text()
    assert not (copy / "pkg/one.py").stat().st_mode & 0o222, "the copy should be read-only"
    (lib / "pkg/one.py").write_text("ONE = 2\n")
    (lib / "gone.py").unlink()
    ws.mirror_library(repo)
    assert (copy / "pkg/one.py").read_text() == "ONE = 2\n" and not (copy / "gone.py").exists()
    assert not (workspace / "exercises").exists(), "mirroring touches nothing but work/course_lib"


def test_stage_holds_lessons_and_solved_exercises(tmp_path):
    staged = ws.stage(tmp_path / "stage")
    lessons = sorted(p.name for p in (staged / "notebooks").glob("*.ipynb"))
    solved = sorted(p.name for p in (staged / "exercises").glob("*.ipynb"))
    assert lessons == sorted(p.name for p in (REPO_DIR / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert solved == sorted(p.name for p in (REPO_DIR / "solutions").glob("[0-9][0-9]_*.ipynb"))
    assert (staged / "exercises" / solved[0]).read_bytes() == (REPO_DIR / "solutions" / solved[0]).read_bytes()


def test_lab_settings_silence_the_news_prompt(monkeypatch, tmp_path):
    monkeypatch.setattr(cli.sys, "prefix", str(tmp_path))
    cli.install_lab_settings()
    settings = json.loads((tmp_path / "share/jupyter/lab/settings/overrides.json").read_text())
    assert settings["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"
