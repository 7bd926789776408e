"""`course`: the learner's command line.

    course lab            set up work/ and start JupyterLab on chapter 00
    course status         every chapter's exercises: passed, failed or not started, and whose code runs
    course check NN       run your exercise notebook NN headless and report each check
    course reset NN       fresh exercise notebook NN (yours is backed up first); --lesson for the lesson
    course sync           copy new or updated course notebooks into work/
    course setup          one-time setup: Jupyter kernel, Graphviz, work/
    course build [--check]    (course authors) exercises/ from solutions/, and every notebook's Colab and Binder
                              cells and the README's badges from pyproject.toml's Repository (course_lib.launch)
    course stage DIR          (course authors) a workspace in DIR with the lessons and solved exercises
    course execute PATH...    (course authors) re-run notebooks in place (solutions/ as a learner would)
    course new SCRIPT OUT     (course authors) a notebook from a percent-format script
"""

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from urllib.parse import urlencode

STARTED = time.monotonic()  # before the imports below: `course check`'s time counts its start-up too

from course_lib import CHECKOUT, REPO_DIR, build, launch, nbtools  # noqa: E402
from course_lib.fast.cache import drop_stale_kernels  # noqa: E402
from course_lib.learner import answers, progress, workspace  # noqa: E402
from course_lib.learner.workspace import CourseError  # noqa: E402

GREEN, RED, YELLOW = "32", "31", "33"


def paint(text, colour):
    """`text` in a terminal colour, or as it is when the output is not a terminal (a file, a pipe) or
    NO_COLOR is set (https://no-color.org)."""
    if not sys.stdout.isatty() or os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return text
    return f"\033[{colour}m{text}\033[0m"


def say(text, indent="", lines=None):
    """Print `text` wrapped to the terminal's width (see `_wrap`), at once."""
    print(_wrap(text, indent, lines), flush=True)


def cmd_sync(args=None):
    report = workspace.sync()
    for what, path in report:
        say(f"{what}: {workspace.shown(path)}")
    workspace.mirror_library()
    if not report:
        say(f"{workspace.shown(workspace.workspace_dir())}/ is up to date with the course: nothing to copy or update.")
    elif any(what.startswith("updated") for what, _ in report):
        say("If JupyterLab has one of these notebooks open, choose Revert when it says the file changed on disk "
            "(or File > Reload Notebook from Disk): Overwrite would write back the version before the update, "
            "which the next `course sync` brings in again.")


def _wrap(text, indent, lines=8):
    """`text` wrapped to the terminal's width under `indent`, whole words only, at most `lines` lines
    (a longer message says how to see the rest; lines=None: no limit)."""
    width = max(60, shutil.get_terminal_size((100, 24)).columns) - len(indent)
    out = []
    for para in text.strip().splitlines():
        out += textwrap.wrap(para, width, break_long_words=False, break_on_hyphens=False,
                             subsequent_indent="    " if para.startswith("  ") else "") or [""]
    if lines is not None and len(out) > lines:
        out = out[:lines] + ["... (the whole message is in the notebook, under the check cell)"]
    return "\n".join(indent + line for line in out)


def cmd_status(args):
    """A table: one row per exercise, grouped by chapter, then a count per chapter. "code used" says
    whether later chapters run your saved code (work/yours/) or the course's. A failed check's message
    follows its row, wrapped, never cut."""
    done = progress.load()
    rows, counts = [], []
    for _, ex in build.pairs():
        results, saved = done.get(ex.name[:2], {}), answers.index(ex.name[:2])
        names = build.check_names(nbtools.read(ex))
        n_passed = 0
        for i, name in enumerate(names):
            r = results.get(name)
            state = "not started" if r is None else "passed" if r["passed"] else "failed"
            n_passed += state == "passed"
            note = r["message"].strip().splitlines()[0] if state == "failed" and r["message"].strip() else ""
            rows.append((ex.stem if i == 0 else "", name, "yours" if name in saved else "course's", state, note))
        counts.append((ex.stem, n_passed, len(names)))
    w_ch = max([len("chapter")] + [len(r[0]) for r in rows])
    w_ex = max([len("exercise")] + [len(r[1]) for r in rows])
    rule = "-" * (w_ch + w_ex + 24)
    colour = {"passed": GREEN, "failed": RED}
    print(f"{'chapter':{w_ch}s}  {'exercise':{w_ex}s}  {'code used':9s}  status")
    for chapter, name, whose, state, note in rows:
        if chapter:
            print(rule)
        print(f"{chapter:{w_ch}s}  {name:{w_ex}s}  {whose:9s}  {paint(state, colour[state]) if state in colour else state}")
        if note:
            print(_wrap(note, " " * (w_ch + 2), lines=3))
    print(rule)
    print("  ".join(f"{c[:2]}: {p}/{n}" for c, p, n in counts))
    print(f"{sum(p for _, p, _ in counts)} of {sum(n for _, _, n in counts)} exercises passed.")


def _error_line(cell):
    errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
    return f"{errors[0].ename}: {errors[0].evalue}" if errors else ""


def check_notebook(path, timeout=600, report=None):
    """Run a notebook headless in its own folder; return [(check name, passed, message, seconds)].

    report(name, passed, message, seconds) is called as each check finishes. Once a check has failed,
    the closing cells that run the chapter's pieces together (tagged "payoff") are skipped: they would
    only fail again, slowly."""
    from jupyter_client.kernelspec import NoSuchKernel

    nb, results, started = workspace.read_notebook(path), [], time.monotonic()

    def skip(cell):
        return any(not ok for _, ok, _, _ in results) and "payoff" in cell.metadata.get("tags", [])

    try:
        for _, cell in nbtools.run_cells(nb, cwd=path.parent, timeout=timeout, allow_errors=True, skip=skip):
            if not build.is_check(cell):
                continue
            msg, seconds = _error_line(cell), time.monotonic() - started
            for name in build.CHECK_CALL.findall(cell.source):
                results.append((name, not msg, msg, seconds))
                if report:
                    report(name, not msg, msg, seconds)
            started = time.monotonic()
    except NoSuchKernel:
        raise CourseError(f"the course's Jupyter kernel ({nbtools.KERNEL['name']}) is not installed here: "
                          "run `course setup`, then this command again") from None
    return results


def cmd_check(args):
    path = workspace.workspace_dir() / "exercises" / workspace.find(args.chapter).name
    chapter = path.name[:2]
    if not path.exists():
        cmd_sync()
        say(f"{workspace.shown(path)} was not there, so `course sync` made a fresh copy: fill in its "
            f"exercises in JupyterLab (`course lab`), then run `course check {chapter}` again.")
        return 1
    total = len(build.check_names(workspace.read_notebook(path)))
    say(f"running {workspace.shown(path)} ({total} checks; each line appears as its check finishes)")
    done = []

    def report(name, ok, msg, seconds):
        done.append(ok)
        print(f"  [{len(done)}/{total}] {paint('passed', GREEN) if ok else paint('failed', RED)}  {name}  "
              f"({seconds:.1f} s)", flush=True)
        if ok and name in answers.index(chapter):
            say(f"kept in work/yours/ch{chapter}.py{answers.used_by(chapter)}", "          ")
        if msg:
            say(msg, "          ", lines=8)

    results = check_notebook(path, report=report)
    n = sum(ok for _, ok, _, _ in results)
    skipped = " The chapter's closing cells were skipped: they run once every check passes." if n < len(results) else ""
    say(f"{n} of {len(results)} checks passed in {time.monotonic() - args.started:.0f} s, "
        f"from the command's start.{skipped}")
    return 0 if n == len(results) else 1


def cmd_reset(args):
    kind = "notebooks" if args.lesson else "exercises"
    saved = workspace.reset(args.chapter, kind)
    say(f"fresh copy: {workspace.shown(workspace.workspace_dir() / kind / workspace.find(args.chapter, kind).name)}")
    say(f"your previous copy is saved as {workspace.shown(saved)}" if saved else "(there was no previous copy)")


def cmd_build(args):
    problems = {s.name: build.lint(nbtools.read(s)) for s, _ in build.pairs()}
    problems |= {f"notebooks/{p.name}": build.lint_lesson(nbtools.read(p), p.name)
                 for p in sorted((REPO_DIR / "notebooks").glob("[0-9][0-9]_*.ipynb"))}
    for name, found in problems.items():
        for p in found:
            print(f"{name}: {p}")
    stale = launch.update(check_only=args.check) + build.build(check_only=args.check)  # launch cells first
    for path in stale:
        print(("out of date: " if args.check else "wrote ") + str(path.relative_to(REPO_DIR)))
    return 1 if (args.check and stale) or any(problems.values()) else 0


def cmd_execute(args):
    for p in map(Path, args.paths):
        if not p.is_file():
            raise CourseError(f"there is no notebook at {p}: give the path of a notebook, as in "
                              "`course execute solutions/00_warmup.ipynb`")
        if p.resolve().parent == (REPO_DIR / "solutions").resolve():
            nb = execute_as_learner(p, timeout=args.timeout)
        else:
            nb = nbtools.execute(workspace.read_notebook(p), cwd=p.parent.resolve(), timeout=args.timeout)
        nbtools.write(nbtools.clean_metadata(nb), p)
        print(f"executed {p}")


def execute_as_learner(path, timeout=600):
    """Run a solved exercise notebook as a learner's: from exercises/ of a fresh temporary workspace,
    so its checks save the answers as the learner's and its closing cells run on them."""
    import tempfile

    previous = os.environ.get("COURSE_WORKSPACE")
    with tempfile.TemporaryDirectory(prefix="course-workspace-") as tmp:
        folder = Path(tmp) / "exercises"
        folder.mkdir()
        os.environ["COURSE_WORKSPACE"] = tmp
        try:
            return nbtools.execute(workspace.read_notebook(path), cwd=folder, timeout=timeout)
        finally:
            if previous is None:
                os.environ.pop("COURSE_WORKSPACE", None)
            else:
                os.environ["COURSE_WORKSPACE"] = previous


def cmd_new(args):
    script = Path(args.script)
    if not script.is_file():
        raise CourseError(f"there is no script at {script}: `course new` reads a percent-format script "
                          "(see CONTRIBUTING.md) and writes the notebook OUT")
    nbtools.write(nbtools.from_script(script.read_text(encoding="utf-8")), args.out)


def install_kernel():
    """Register this environment's kernel, with the CUDA device choice made once here."""
    from course_lib import device

    cmd = [sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3",
           "--display-name", nbtools.KERNEL["display_name"],
           # PyTorch's idle OpenMP threads otherwise spin and take the cores from the Numba kernels
           # that run next (20x slower fused kernels in chapter 10 on 2 cores)
           "--env", "OMP_WAIT_POLICY", "PASSIVE"]
    if not device.gpu_present():
        cmd += ["--env", "NUMBA_ENABLE_CUDASIM", "1"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    print("Jupyter kernel: " + ("GPU found, kernels run on it" if "NUMBA_ENABLE_CUDASIM" not in cmd
                                else "no GPU found, CUDA kernels will use Numba's simulator"))


def ensure_dot():
    if shutil.which("dot"):
        return True
    if platform.system() == "Linux" and os.geteuid() == 0 and shutil.which("apt-get"):
        print("Installing Graphviz (apt-get update; apt-get install graphviz) ...")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env)  # a fresh container has no package lists
        subprocess.run(["apt-get", "install", "-y", "-qq", "graphviz"], check=False, env=env)
        if shutil.which("dot"):
            return True
    print(paint("Graphviz's `dot` is missing, so graph pictures will not render. Install it with:\n"
                "  Debian/Ubuntu: sudo apt-get install graphviz\n  macOS:         brew install graphviz\n"
                "  conda:         conda install -c conda-forge graphviz", YELLOW))
    return False


LAB_SETTINGS = {
    # No "would you like to receive official Jupyter news?" prompt, and no update checks.
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
}


def install_lab_settings():
    """JupyterLab defaults for this environment (overrides.json in its settings folder)."""
    folder = Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "overrides.json"
    text = json.dumps(LAB_SETTINGS, indent=1) + "\n"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def cmd_stage(args):
    say(f"staged {workspace.stage(args.folder)}")


def cmd_setup(args):
    install_kernel()
    install_lab_settings()
    ensure_dot()
    cmd_sync()


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
    The files that do it are in course_lib/shell/; a shell they do not know starts as it is, on the
    PATH `course lab` set."""
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
    also keeps the kernel from warning, at each start, that plain TCP can be read by other programs."""
    import zmq

    return ["--MappingKernelManager.transport_encryption=auto"] if zmq.has("curve") else []


def lab_command(root, extra=()):
    """(argv, env) of the JupyterLab server that `course lab` starts, in the folder `root`:
    - on 127.0.0.1, with a token it chooses (passed in the environment, so that neither the command
      line nor the server's log shows it) and over the workspace, opening the welcome lesson with the
      file browser at the workspace's top;
    - kernels as `kernel_settings` says, trusting the notebooks `course sync` signed
      (`workspace.trust`), and JupyterLab's terminal as `terminal_command` says;
    - no websocket pings: they keep connections alive through proxies, and 127.0.0.1 has none
      (jupyter_server's ping settings also make Tornado 6.5 warn at every start);
    - the server's own log at WARNING: its banner shows the token-less URL; `course lab` prints one
      that logs in (`lab_url`)."""
    import secrets

    argv = [sys.executable, "-m", "jupyter", "lab", "--ServerApp.ip=127.0.0.1", f"--ServerApp.root_dir={root}",
            f"--LabApp.default_url={START_URL}", f"--NotebookNotary.data_dir={workspace.trust_dir()}",
            "--ServerApp.terminado_settings=" + json.dumps({"shell_command": terminal_command()}),
            "--ServerApp.tornado_settings=" + json.dumps({"ws_ping_interval": 0}),
            "--ServerApp.log_level=WARN", "--LabApp.log_level=WARN", *kernel_settings()]
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


def cmd_lab(args):
    cmd_sync()
    install_lab_settings()
    ensure_dot()
    root = workspace.workspace_dir()
    argv, env = lab_command(root, args.jupyter_args)
    # The server runs in the workspace, so that a terminal JupyterLab opens "here" starts in work/.
    server = subprocess.Popen(argv, env=env, cwd=root)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Control-C reaches the server, which asks to confirm
    signal.signal(signal.SIGTERM, lambda *_: server.terminate())
    info = server_info(server.pid, alive=lambda: server.poll() is None)
    if info:
        print(f"JupyterLab is running on {root}; your browser should open chapter 00. If it does not, or "
              "to open it from another browser, paste this URL (it logs you in):", flush=True)
        print(f"    {lab_url(info)}", flush=True)
        print("Control-C stops JupyterLab (twice: without asking).", flush=True)
    return server.wait()


# Every command but `new` reads the course's notebooks or writes beside them, so it needs the course's
# folder (a clone); a library that pip installed alone (a wheel, Colab) has none.
NEEDS_CHECKOUT = {"status", "check", "reset", "sync", "setup", "lab", "build", "stage", "execute"}


def needs_checkout(command):
    """The one line a command that needs the course's folder prints when the library was installed alone."""
    from importlib import metadata

    try:
        urls = metadata.metadata("course_lib").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        urls = []
    repo = next((u.split(",", 1)[1].strip() for u in urls if u.lower().startswith("repository")), "the course's repository")
    return (f"`course {command}` needs a local setup: it works on the course's folder (its notebooks and your work/), "
            f"and this library was installed without one. Clone {repo}, then run `make lab` there (see its README).")


def main(argv=None):
    p = argparse.ArgumentParser(prog="course", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("status").set_defaults(fn=cmd_status)
    sub.add_parser("sync").set_defaults(fn=cmd_sync)
    sub.add_parser("setup").set_defaults(fn=cmd_setup)
    q = sub.add_parser("check")
    q.add_argument("chapter")
    q.set_defaults(fn=cmd_check)
    q = sub.add_parser("reset")
    q.add_argument("chapter")
    q.add_argument("--lesson", action="store_true", help="reset the lesson notebook instead")
    q.set_defaults(fn=cmd_reset)
    q = sub.add_parser("build")
    q.add_argument("--check", action="store_true", help="only report stale exercise notebooks")
    q.set_defaults(fn=cmd_build)
    q = sub.add_parser("stage")
    q.add_argument("folder")
    q.set_defaults(fn=cmd_stage)
    q = sub.add_parser("execute")
    q.add_argument("paths", nargs="+")
    q.add_argument("--timeout", type=int, default=600)
    q.set_defaults(fn=cmd_execute)
    q = sub.add_parser("new")
    q.add_argument("script")
    q.add_argument("out")
    q.set_defaults(fn=cmd_new)
    sub.add_parser("lab", help="extra arguments go to jupyter lab").set_defaults(fn=cmd_lab)
    args, extra = p.parse_known_args(argv)
    if extra and args.cmd != "lab":
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    args.jupyter_args = extra
    # the command line's own start; a call from Python (the tests) counts from here
    args.started = STARTED if argv is None else time.monotonic()
    if args.cmd in NEEDS_CHECKOUT and not CHECKOUT:
        print(needs_checkout(args.cmd), file=sys.stderr)
        return 2
    drop_stale_kernels()  # before any kernel runs here or in a notebook this command starts (fast/cache.py)
    try:
        return args.fn(args) or 0
    except CourseError as e:  # a problem the learner can fix: one line that says how, nothing lost
        print(_wrap(f"course {args.cmd}: {e}", ""), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
