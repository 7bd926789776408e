"""How `course lab` starts JupyterLab, piece by piece (tests/test_browser.py drives the whole of it):
the terminal's shell, the server's command line, and the URL it prints."""

import json
import os
import shutil
import time

import pytest

from course_lib.course import lab

SHELLS = ["bash", "sh", "dash", "zsh"]


def _run_in_terminal(argv, env, cwd, typed, out, timeout=20):
    """Start `argv` in a pseudo-terminal, as JupyterLab's terminal does (terminado), type `typed`."""
    from ptyprocess import PtyProcessUnicode

    term = PtyProcessUnicode.spawn(argv, env=env, cwd=str(cwd), dimensions=(24, 120))
    try:
        term.write(typed + "\n")
        deadline = time.time() + timeout
        while not out.exists() and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)
    finally:
        term.terminate(force=True)


@pytest.mark.parametrize("name", SHELLS)
def test_the_terminal_puts_the_course_first_after_the_learners_startup_files(tmp_path, name):
    """The learner's login files set PATH afresh and change folder (as Debian's /etc/profile and a
    ~/.profile or ~/.zprofile may): the terminal still finds the course's commands first, in the folder
    JupyterLab asked for, and the learner's own settings are there."""
    shell = shutil.which(name)
    if shell is None:
        pytest.skip(f"{name} is not installed here, so its terminal files were not tried")
    home, start, out = tmp_path / "home", tmp_path / "start here", tmp_path / "out.txt"
    home.mkdir()
    start.mkdir()
    login = "PATH=/usr/bin:/bin\nexport PATH\nLEARNERS_OWN=yes\nexport LEARNERS_OWN\ncd /\n"
    for file in (".profile", ".bash_profile", ".zprofile"):
        (home / file).write_text(login)
    env = {"HOME": str(home), "SHELL": shell, "PATH": "/usr/bin:/bin", "COURSE_BIN": "/the/course/bin", "TERM": "xterm"}
    _run_in_terminal(lab.terminal_command(shell), env, start, f'echo "$PATH|$PWD|$LEARNERS_OWN" > "{out}"', out)
    path, pwd, own = out.read_text().strip().split("|")
    assert path.split(":")[0] == "/the/course/bin", path
    assert pwd == str(start)
    assert own == "yes", "the learner's own startup file was not read"


def test_zsh_reads_the_learners_zdotdir(tmp_path):
    shell = shutil.which("zsh")
    if shell is None:
        pytest.skip("zsh is not installed here, so its terminal files were not tried")
    home, dot, out = tmp_path / "home", tmp_path / "dotfiles", tmp_path / "out.txt"
    home.mkdir()
    dot.mkdir()
    (dot / ".zshrc").write_text("FROM_ZDOTDIR=yes\n")
    env = {"HOME": str(home), "SHELL": shell, "PATH": "/usr/bin:/bin", "COURSE_BIN": "/the/course/bin",
           "ZDOTDIR": str(dot), "TERM": "xterm"}
    os_environ = dict(os.environ)
    try:
        os.environ["ZDOTDIR"] = str(dot)  # `course lab` reads the learner's ZDOTDIR from its own environment
        argv = lab.terminal_command(shell)
    finally:
        os.environ.clear()
        os.environ.update(os_environ)
    _run_in_terminal(argv, env, tmp_path, f'echo "$FROM_ZDOTDIR|$ZDOTDIR|${{PATH%%:*}}" > "{out}"', out)
    assert out.read_text().strip() == f"yes|{dot}|/the/course/bin"


def test_the_server_command_keeps_the_token_out_of_sight(tmp_path):
    """The token is in the server's environment, never on its command line (where `ps` shows it) nor,
    at WARN, in its log; kernels over TCP; the terminal as `terminal_command` says; no pings."""
    argv, env = lab.lab_command(tmp_path, ["--no-browser"])
    assert env["JUPYTER_TOKEN"] and env["JUPYTER_TOKEN"] not in " ".join(argv)
    assert not any("transport=ipc" in a or "KernelManager.ip" in a for a in argv)
    assert f"--ServerApp.root_dir={tmp_path}" in argv and argv[-1] == "--no-browser"
    assert "--ServerApp.log_level=WARN" in argv
    terminado = json.loads(next(a for a in argv if a.startswith("--ServerApp.terminado_settings=")).split("=", 1)[1])
    assert terminado["shell_command"] == lab.terminal_command()
    assert env["PATH"].split(os.pathsep)[0] == env["COURSE_BIN"]
    assert lab.lab_command(tmp_path)[1]["JUPYTER_TOKEN"] != env["JUPYTER_TOKEN"], "a new token each time"


def test_the_printed_url_has_one_query(tmp_path):
    info = {"url": "http://127.0.0.1:8890/", "token": "abc123"}
    url = lab.lab_url(info)
    assert url == "http://127.0.0.1:8890/lab/tree/notebooks/00_welcome.ipynb?file-browser-path=/&token=abc123"
    assert lab.lab_url({"url": "http://127.0.0.1:8890/base/", "token": ""}).endswith("00_welcome.ipynb?file-browser-path=/")


def test_server_info_waits_for_the_servers_own_record(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    assert lab.server_info(12345, timeout=0.5) is None
    (tmp_path / "jpserver-12345.json").write_text(json.dumps({"url": "http://127.0.0.1:1/", "token": "t"}))
    assert lab.server_info(12345, timeout=5)["token"] == "t"
    assert lab.server_info(999, timeout=5, alive=lambda: False) is None, "a server that stopped is not waited for"
