"""Every `course` command answers bad input with one clear line that says what to do, exit status 2,
and loses nothing; and the small things a learner reads: wrapped lines, the time a check took from the
command's start, colour only in a terminal, a sync that says when there was nothing to do."""

import json
import shutil
import time

import nbformat
import pytest

from course_lib import REPO_DIR
from course_lib.course import commands
from course_lib.course.workspace import stage, sync


def _fails_with(capsys, argv, *phrases):
    """Run `course ARGV`: status 2, nothing on stdout's last line but no traceback, and one message on
    stderr (wrapped to the terminal) with every phrase in it."""
    assert commands.main(argv) == 2
    out, err = capsys.readouterr()
    message = " ".join(err.split())
    assert message.startswith(f"course {argv[0]}: "), err
    assert "Traceback" not in out + err
    for phrase in phrases:
        assert phrase in message, f"{phrase!r} is not in: {message}"
    return message


@pytest.mark.parametrize("chapter", ["abc", "1a", "", "-1"])
def test_a_chapter_that_is_not_a_number(workspace, capsys, chapter):
    for command in ("check", "reset"):
        _fails_with(capsys, [command, chapter], "is not a chapter number", "`course status` lists them")
    assert not workspace.exists(), "nothing was written for a bad chapter"


def test_a_chapter_the_course_does_not_have(workspace, capsys):
    _fails_with(capsys, ["check", "99"], "there is no chapter 99", "the chapters are 00 to")
    _fails_with(capsys, ["reset", "42", "--lesson"], "there is no chapter 42 in the course's notebooks/")


def test_a_broken_exercise_notebook(workspace, capsys):
    """A notebook that is not JSON (a save cut short): `course check` names it, its last checkpoint and
    `course reset`, and leaves it as it is; `course reset` keeps it in backups/ and gives a fresh one."""
    commands.main(["sync"])
    capsys.readouterr()
    mine = workspace / "exercises/01_autograd.ipynb"
    broken = mine.read_bytes()[: len(mine.read_bytes()) // 2]
    mine.write_bytes(broken)
    checkpoint = workspace / "exercises/.ipynb_checkpoints/01_autograd-checkpoint.ipynb"
    checkpoint.parent.mkdir()
    shutil.copy(REPO_DIR / "exercises/01_autograd.ipynb", checkpoint)
    _fails_with(capsys, ["check", "01"], "exercises/01_autograd.ipynb is not a notebook that can be read",
                "01_autograd-checkpoint.ipynb", "`course reset 01` keeps the broken file in work/backups/")
    assert mine.read_bytes() == broken, "the broken file was changed"

    assert commands.main(["reset", "01"]) == 0
    assert "your previous copy is saved as" in capsys.readouterr().out
    assert [p.read_bytes() for p in (workspace / "backups").glob("01_autograd.*.ipynb")] == [broken]
    nbformat.read(str(mine), as_version=4)  # a notebook again


def test_sync_leaves_a_broken_notebook_and_updates_the_others(workspace, capsys, tmp_path):
    course = tmp_path / "course"
    for kind in ("notebooks", "exercises"):
        (course / kind).mkdir(parents=True)
    shutil.copy(REPO_DIR / "notebooks/00_welcome.ipynb", course / "notebooks")
    shutil.copy(REPO_DIR / "exercises/00_warmup.ipynb", course / "exercises")
    sync.sync(course)
    lesson = workspace / "notebooks/00_welcome.ipynb"
    lesson.write_text("{ not json")
    for name in ("notebooks/00_welcome.ipynb", "exercises/00_warmup.ipynb"):
        p = course / name
        p.write_text(p.read_text().replace("00 ·", "00 (updated) ·", 1).replace("Welcome", "Welcome (updated)", 1))
    report = {p.relative_to(workspace).as_posix(): what for what, p in sync.sync(course)}
    assert report["notebooks/00_welcome.ipynb"].startswith("left as it is: ")
    assert "`course reset --lesson 00`" in report["notebooks/00_welcome.ipynb"]
    assert report["exercises/00_warmup.ipynb"] == "updated"
    assert lesson.read_text() == "{ not json"


def test_check_with_no_workspace_makes_one_and_runs_nothing(workspace, capsys):
    """No work/ at all: `course check` copies the course's notebooks in and says what to do next."""
    assert commands.main(["check", "00"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "exercises/00_warmup.ipynb was not there, so `course sync` made a fresh copy" in out
    assert "then run `course check 00` again" in out and "checks passed" not in out
    assert (workspace / "exercises/00_warmup.ipynb").exists()


def test_status_with_no_workspace(workspace, capsys):
    assert commands.main(["status"]) == 0
    assert "not started" in capsys.readouterr().out


def test_stage_never_empties_a_folder_it_did_not_make(workspace, capsys, tmp_path):
    mine = tmp_path / "my-project"
    mine.mkdir()
    (mine / "thesis.tex").write_text("months of work")
    _fails_with(capsys, ["stage", str(mine)], "`course stage` did not make it", "name a new folder")
    assert (mine / "thesis.tex").read_text() == "months of work"
    commands.main(["sync"])
    _fails_with(capsys, ["stage", str(workspace)], "`course stage` did not make it")
    assert (workspace / "exercises/00_warmup.ipynb").exists()
    staged = tmp_path / "stage"
    for _ in range(2):  # a folder it made, it empties and fills again
        assert commands.main(["stage", str(staged)]) == 0
        (staged / "exercises/leftover.txt").write_text("from a test run")
    assert (staged / stage.STAGED).exists()


def test_execute_and_new_name_the_missing_file(workspace, capsys, tmp_path):
    _fails_with(capsys, ["execute", str(tmp_path / "nope.ipynb")], "there is no notebook at", "nope.ipynb")
    _fails_with(capsys, ["new", str(tmp_path / "nope.py"), str(tmp_path / "out.ipynb")], "there is no script at")
    assert not (tmp_path / "out.ipynb").exists()


def test_a_missing_kernel_says_run_course_setup(workspace, capsys, monkeypatch):
    from jupyter_client.kernelspec import NoSuchKernel

    def no_kernel(*args, **kwargs):
        raise NoSuchKernel("python3")
        yield
    monkeypatch.setattr(commands.nbtools, "run_cells", no_kernel)
    commands.main(["sync"])
    capsys.readouterr()
    _fails_with(capsys, ["check", "00"], "the course's Jupyter kernel (python3) is not installed here",
                "run `course setup`")


def test_sync_says_when_there_is_nothing_to_do(workspace, capsys):
    commands.main(["sync"])
    assert "added:" in capsys.readouterr().out
    commands.main(["sync"])
    assert "is up to date with the course: nothing to copy or update." in " ".join(capsys.readouterr().out.split())


def test_check_lines_are_wrapped_whole_and_its_time_counts_the_start_up(workspace, capsys, monkeypatch):
    """In a terminal 60 columns wide every line of `course check` fits, no word cut; its closing line
    counts from the command's start (Python's and the kernel's start-up included)."""
    (workspace / "exercises").mkdir(parents=True)
    shutil.copy(REPO_DIR / "exercises/00_warmup.ipynb", workspace / "exercises/00_warmup.ipynb")
    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.setattr(commands.sys, "argv", ["course", "check", "00"])
    monkeypatch.setattr(commands, "STARTED", time.monotonic() - 30)  # as if Python took 30 s to start
    assert commands.main() == 1
    out = capsys.readouterr().out
    assert all(len(line) <= 60 or len(line.split()) == 1 for line in out.splitlines()), out  # a long path stays whole
    summary = " ".join(out.split()).split("0 of 3 checks passed in ")[1]
    assert int(summary.split()[0]) >= 30, summary


def test_colour_only_in_a_terminal(workspace, capsys, monkeypatch):
    progress = {"00": {"numerical_derivative": {"passed": True, "message": "", "time": ""},
                       "numerical_gradient": {"passed": False, "message": "off by one", "time": ""}}}
    (workspace).mkdir(parents=True)
    (workspace / ".progress.json").write_text(json.dumps(progress))
    commands.main(["status"])
    assert "\x1b[" not in capsys.readouterr().out, "colour codes written into a file or a pipe"
    monkeypatch.setattr(commands.sys.stdout, "isatty", lambda: True)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    commands.main(["status"])
    assert "\x1b[32mpassed" in capsys.readouterr().out
    monkeypatch.setenv("NO_COLOR", "1")
    commands.main(["status"])
    assert "\x1b[" not in capsys.readouterr().out
