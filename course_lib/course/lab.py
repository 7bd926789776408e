"""`course lab`: JupyterLab on the learner's workspace, as a learner needs it.

- Kernels over Jupyter's default transport, TCP on 127.0.0.1 (`kernel_settings` says why).
- A terminal that starts in work/ with the course's `course` and `python` first on PATH, whatever
  the learner's login files do (`terminal_command`, and the shell files in shell/).
- A URL, printed once the server runs, that logs in and opens chapter 00 (`lab_url`); the token is
  in no log and on no command line.
- Notebooks `course sync` signed open trusted (workspace/copies.py), so their graphs show.
"""

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

from course_lib.course.printing import say
from course_lib.course.workspace.copies import trust_dir

# Where `course lab` opens: the welcome lesson, with the file browser at the workspace's top.
START_PATH = "lab/tree/notebooks/00_welcome.ipynb"
START_QUERY = {"file-browser-path": "/"}
START_URL = "/" + START_PATH + "?" + urlencode(START_QUERY, safe="/")
SHELL_FILES = Path(__file__).resolve().parent / "shell"


def terminal_command(shell=None):
    """The command JupyterLab's terminal runs: the learner's shell ($SHELL), reading their own startup
    files as a login shell does, and then putting this environment's commands (`course`, `python`,
    `pip`) first on PATH (from COURSE_BIN) in the folder JupyterLab asked for. A plain login shell
    would not do: Debian's /etc/profile and macOS's /etc/zprofile rewrite PATH after JupyterLab set it.
    The files that do it are in shell/; a shell they do not know starts as it is, on the PATH `course
    lab` set."""
    shell = shell or os.environ.get("SHELL") or shutil.which("sh") or "/bin/sh"
    name, env = os.path.basename(shell), shutil.which("env") or "/usr/bin/env"
    if name == "bash":
        return [shell, "--rcfile", str(SHELL_FILES / "bashrc"), "-i"]
    if name == "zsh":
        user = [f"COURSE_USER_ZDOTDIR={os.environ['ZDOTDIR']}"] if os.environ.get("ZDOTDIR") else []
        return [env, f"ZDOTDIR={SHELL_FILES / 'zsh'}", *user, shell, "-l"]
    if name in ("sh", "dash", "ksh", "mksh"):
        return [env, f"ENV={SHELL_FILES / 'profile'}", shell, "-i"]
    return [shell]


def kernel_settings():
    """How the server talks to its kernels: Jupyter's default transport, TCP on 127.0.0.1, where each
    kernel gets its own five ports (the server's port cache hands out each port once) and signs every
    message with its own key. Kernels over local (IPC) sockets shared one path prefix and collided
    when JupyterLab reopened several notebooks at once ("Invalid Signature", cells stuck at [*]).
    Where ZeroMQ has CurveZMQ, the kernels' traffic is also encrypted (`transport_encryption`), which
    also keeps each kernel from warning, as it starts, that plain TCP can be read by other programs."""
    import zmq

    return ["--MappingKernelManager.transport_encryption=auto"] if zmq.has("curve") else []


def lab_command(root, extra=()):
    """(argv, env) of the JupyterLab server that `course lab` starts, in the folder `root`:
    - on 127.0.0.1, with a token it chooses (passed in the environment, so that neither the command
      line nor the server's log shows it) and over the workspace, opening the welcome lesson with the
      file browser at the workspace's top;
    - kernels as `kernel_settings` says, trusting the notebooks `course sync` signed, and JupyterLab's
      terminal as `terminal_command` says;
    - no websocket pings: they keep connections alive through proxies, and 127.0.0.1 has none
      (jupyter_server's ping settings also make Tornado 6.5 warn at every start);
    - the server's own log at WARNING: its banner shows the token-less URL; `course lab` prints one
      that logs in (`lab_url`)."""
    argv = [sys.executable, "-m", "jupyter", "lab", "--ServerApp.ip=127.0.0.1", f"--ServerApp.root_dir={root}",
            f"--LabApp.default_url={START_URL}", f"--NotebookNotary.data_dir={trust_dir()}",
            "--ServerApp.tornado_settings=" + json.dumps({"ws_ping_interval": 0}),
            "--ServerApp.log_level=WARN", "--LabApp.log_level=WARN", *kernel_settings()]
    if os.name == "posix":  # on Windows, Jupyter's own choice (PowerShell) on the PATH set below
        argv.append("--ServerApp.terminado_settings=" + json.dumps({"shell_command": terminal_command()}))
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")
    bindir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", ""), "COURSE_BIN": bindir,
           "JUPYTER_TOKEN": secrets.token_hex(24)}
    return argv + list(extra), env


def server_info(pid, timeout=120, alive=lambda: True):
    """The running server's own record (jpserver-PID.json in Jupyter's runtime folder: its port, base
    URL and token), once it has written it; None if the server stopped first or `timeout` passed."""
    from jupyter_core.paths import jupyter_runtime_dir

    path = Path(jupyter_runtime_dir()) / f"jpserver-{pid}.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            time.sleep(0.2)
    return None


def lab_url(info):
    """The URL that logs in and opens the welcome lesson: the token joins the start page's own query
    (the server's banner appends "?token=" to a URL that already has one)."""
    query = urlencode({**START_QUERY, "token": info["token"]} if info.get("token") else START_QUERY, safe="/")
    return f"{info['url'].rstrip('/')}/{START_PATH}?{query}"


def serve(root, extra=()):
    """Run JupyterLab on `root` until it stops; print the URL that logs in once it runs. The server runs
    in `root`, so that a terminal JupyterLab opens "here" starts in work/. Control-C goes to the server
    (which asks to confirm); a SIGTERM to `course lab` stops it. Returns the server's exit status."""
    argv, env = lab_command(root, extra)
    server = subprocess.Popen(argv, env=env, cwd=root)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: server.terminate())
    info = server_info(server.pid, alive=lambda: server.poll() is None)
    if info:
        say(f"JupyterLab is running on {root}; your browser should open chapter 00. If it does not, or to "
            "open it from another browser, paste this URL (it logs you in):")
        print(f"    {lab_url(info)}", flush=True)  # on one line, however long, to be copied whole
        say("Control-C stops JupyterLab (twice: without asking).")
    elif server.poll() is None:
        say("JupyterLab is still starting: `jupyter server list` will show its URL.")
    return server.wait()
