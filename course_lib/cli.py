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
    course serve [--port N]   chapter 14's GPT behind an OpenAI-compatible server on 127.0.0.1 (course_lib/serve/cli.py)
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from course_lib import CHECKOUT, REPO_DIR, build, launch, nbtools
from course_lib.fast.cache import drop_stale_kernels
from course_lib.learner import answers, progress, workspace

GREEN, RED, YELLOW, RESET = "\033[32m", "\033[31m", "\033[33m", "\033[0m"


def cmd_sync(args=None):
    for what, path in workspace.sync():
        print(f"{what}: {path.relative_to(REPO_DIR) if path.is_relative_to(REPO_DIR) else path}")
    workspace.mirror_library()


def _wrap(text, indent, lines=8):
    """`text` wrapped to the terminal's width under `indent`, whole words only, at most `lines` lines
    (a longer message says how to see the rest)."""
    width = max(60, shutil.get_terminal_size((100, 24)).columns) - len(indent)
    out = []
    for para in text.strip().splitlines():
        out += textwrap.wrap(para, width, break_long_words=False, break_on_hyphens=False,
                             subsequent_indent="    " if para.startswith("  ") else "") or [""]
    if len(out) > lines:
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
    colour = {"passed": GREEN, "failed": RED, "not started": ""}
    print(f"{'chapter':{w_ch}s}  {'exercise':{w_ex}s}  {'code used':9s}  status")
    for chapter, name, whose, state, note in rows:
        if chapter:
            print(rule)
        print(f"{chapter:{w_ch}s}  {name:{w_ex}s}  {whose:9s}  {colour[state]}{state}{RESET if colour[state] else ''}")
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
    nb, results, started = nbtools.read(path), [], time.monotonic()

    def skip(cell):
        return any(not ok for _, ok, _, _ in results) and "payoff" in cell.metadata.get("tags", [])

    for _, cell in nbtools.run_cells(nb, cwd=path.parent, timeout=timeout, allow_errors=True, skip=skip):
        if not build.is_check(cell):
            continue
        msg, seconds = _error_line(cell), time.monotonic() - started
        for name in build.CHECK_CALL.findall(cell.source):
            results.append((name, not msg, msg, seconds))
            if report:
                report(name, not msg, msg, seconds)
        started = time.monotonic()
    return results


def cmd_check(args):
    path = workspace.workspace_dir() / "exercises" / workspace.find(args.chapter).name
    if not path.exists():
        cmd_sync()
    chapter = path.name[:2]
    total = len(build.check_names(nbtools.read(path)))
    print(f"running {path} ({total} checks; each line appears as its check finishes)", flush=True)
    start, done = time.monotonic(), []

    def report(name, ok, msg, seconds):
        done.append(ok)
        mark = f"{GREEN}passed{RESET}" if ok else f"{RED}failed{RESET}"
        print(f"  [{len(done)}/{total}] {mark}  {name}  ({seconds:.1f} s)", flush=True)
        if ok and name in answers.index(chapter):
            print(f"          kept in work/yours/ch{chapter}.py{answers.used_by(chapter)}", flush=True)
        if msg:
            print(_wrap(msg, "          "), flush=True)

    results = check_notebook(path, report=report)
    n = sum(ok for _, ok, _, _ in results)
    skipped = " (the chapter's closing cells were skipped: they run once every check passes)" if n < len(results) else ""
    print(f"{n} of {len(results)} checks passed in {time.monotonic() - start:.0f} s.{skipped}")
    return 0 if n == len(results) else 1


def cmd_reset(args):
    kind = "notebooks" if args.lesson else "exercises"
    saved = workspace.reset(args.chapter, kind)
    print(f"fresh copy: work/{kind}/{workspace.find(args.chapter, kind).name}")
    print(f"your previous copy is saved as {saved}" if saved else "(there was no previous copy)")


def cmd_build(args):
    problems = {s.name: build.lint(nbtools.read(s)) for s, _ in build.pairs()}
    for name, found in problems.items():
        for p in found:
            print(f"{name}: {p}")
    stale = launch.update(check_only=args.check) + build.build(check_only=args.check)  # launch cells first
    for path in stale:
        print(("out of date: " if args.check else "wrote ") + str(path.relative_to(REPO_DIR)))
    return 1 if (args.check and stale) or any(problems.values()) else 0


def cmd_execute(args):
    for p in args.paths:
        p = Path(p)
        if p.resolve().parent == (REPO_DIR / "solutions").resolve():
            nb = execute_as_learner(p, timeout=args.timeout)
        else:
            nb = nbtools.execute(nbtools.read(p), cwd=p.parent.resolve(), timeout=args.timeout)
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
            return nbtools.execute(nbtools.read(path), cwd=folder, timeout=timeout)
        finally:
            if previous is None:
                os.environ.pop("COURSE_WORKSPACE", None)
            else:
                os.environ["COURSE_WORKSPACE"] = previous


def cmd_new(args):
    nbtools.write(nbtools.from_script(Path(args.script).read_text()), args.out)


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
    print(f"{YELLOW}Graphviz's `dot` is missing, so graph pictures will not render. Install it with:\n"
          "  Debian/Ubuntu: sudo apt-get install graphviz\n  macOS:         brew install graphviz\n"
          f"  conda:         conda install -c conda-forge graphviz{RESET}")
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
    print(f"staged {workspace.stage(args.folder)}")


def cmd_setup(args):
    install_kernel()
    install_lab_settings()
    ensure_dot()
    cmd_sync()


# Where `course lab` opens: the welcome lesson, with the file browser at the workspace's top.
START_URL = "/lab/tree/notebooks/00_welcome.ipynb?file-browser-path=/"


def lab_argv(root):
    """The `jupyter lab` command line `course lab` runs: JupyterLab on 127.0.0.1 over the workspace,
    the welcome lesson open and the file browser at the workspace's top (notebooks/, exercises/,
    course_lib/ and yours/ in sight). On Linux and macOS the server's kernels talk over local (IPC)
    sockets in a private folder, so none listens on a TCP port and none prints the plain-TCP warning."""
    import tempfile

    argv = [sys.executable, "-m", "jupyter", "lab", "--ServerApp.ip=127.0.0.1", f"--ServerApp.root_dir={root}",
            f"--LabApp.default_url={START_URL}"]
    if os.name == "posix":
        sockets = tempfile.mkdtemp(prefix="course-kernels-")
        argv += ["--KernelManager.transport=ipc", f"--KernelManager.ip={os.path.join(sockets, 'k')}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")
    return argv


def cmd_lab(args):
    cmd_sync()
    install_lab_settings()
    ensure_dot()
    # JupyterLab's terminals inherit the server's PATH: put this environment's commands (`course`,
    # `python`, `pip`) first on it, as an activated virtual environment would.
    bindir = os.path.dirname(sys.executable)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    os.execv(sys.executable, lab_argv(workspace.workspace_dir()) + args.jupyter_args)


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
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:        # its options are its own: course_lib/serve/cli.py
        from course_lib.serve.cli import main as serve

        return serve(argv[1:])
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
    if args.cmd in NEEDS_CHECKOUT and not CHECKOUT:
        print(needs_checkout(args.cmd), file=sys.stderr)
        return 2
    drop_stale_kernels()  # before any kernel runs here or in a notebook this command starts (fast/cache.py)
    return args.fn(args) or 0


if __name__ == "__main__":
    sys.exit(main())
