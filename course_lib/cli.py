"""`course`: the learner's command line.

    course lab            set up work/ and start JupyterLab on chapter 00
    course status         every chapter's exercises: passed, failed or not started, and whose code runs
    course check NN       run your exercise notebook NN headless and report each check
    course reset NN       fresh exercise notebook NN (yours is backed up first); --lesson for the lesson
    course sync           copy new or updated course notebooks into work/
    course setup          one-time setup: Jupyter kernel, Graphviz, work/
    course build [--check]    (course authors) regenerate exercises/ from solutions/
    course stage DIR          (course authors) a workspace in DIR with the lessons and solved exercises
    course execute PATH...    (course authors) re-run notebooks in place (solutions/ as a learner would)
    course new SCRIPT OUT     (course authors) a notebook from a percent-format script
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from course_lib import REPO_DIR, build, keep, nbtools, progress, workspace

GREEN, RED, YELLOW, RESET = "\033[32m", "\033[31m", "\033[33m", "\033[0m"


def cmd_sync(args=None):
    for what, path in workspace.sync():
        print(f"{what}: {path.relative_to(REPO_DIR) if path.is_relative_to(REPO_DIR) else path}")
    workspace.mirror_library()


def cmd_status(args):
    """A table: one row per exercise, grouped by chapter, then a count per chapter. "code used" says
    whether later chapters run your saved code (work/yours/) or the course's."""
    done = progress.load()
    rows, counts = [], []
    for _, ex in build.pairs():
        results, saved = done.get(ex.name[:2], {}), keep.index(ex.name[:2])
        names = build.check_names(nbtools.read(ex))
        n_passed = 0
        for i, name in enumerate(names):
            r = results.get(name)
            state = "not started" if r is None else "passed" if r["passed"] else "failed"
            n_passed += state == "passed"
            note = f"  {r['message'].splitlines()[0][:60]}" if state == "failed" else ""
            rows.append((ex.stem if i == 0 else "", name, "yours" if name in saved else "course's", state, note))
        counts.append((ex.stem, n_passed, len(names)))
    colour = {"passed": GREEN, "failed": RED, "not started": ""}
    print(f"{'chapter':22s} {'exercise':26s} {'code used':10s} status")
    for chapter, name, whose, state, note in rows:
        if chapter:
            print("-" * 70)
        print(f"{chapter:22s} {name:26s} {whose:10s} {colour[state]}{state}{RESET if colour[state] else ''}{note}")
    print("-" * 70)
    print("  ".join(f"{c[:2]}: {p}/{n}" for c, p, n in counts))
    print(f"{sum(p for _, p, _ in counts)} of {sum(n for _, _, n in counts)} exercises passed.")


def check_notebook(path, timeout=600):
    """Run a notebook headless in its own folder; return [(check name, passed, message)]."""
    nb = nbtools.execute(nbtools.read(path), cwd=path.parent, timeout=timeout, allow_errors=True)
    results = []
    for cell in nb.cells:
        if not build.is_check(cell):
            continue
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        for name in build.CHECK_CALL.findall(cell.source):
            msg = f"{errors[0].ename}: {errors[0].evalue}" if errors else ""
            results.append((name, not errors, msg))
    return results


def cmd_check(args):
    path = workspace.workspace_dir() / "exercises" / workspace.find(args.chapter).name
    if not path.exists():
        cmd_sync()
    print(f"running {path} ...")
    results = check_notebook(path)
    for name, ok, msg in results:
        mark = f"{GREEN}passed{RESET}" if ok else f"{RED}failed{RESET}"
        first = msg.splitlines()[0][:100] if msg else ""
        print(f"  {mark}  {name}  {first}")
    n = sum(ok for _, ok, _ in results)
    print(f"{n} of {len(results)} checks passed.")
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
    stale = build.build(check_only=args.check)
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
           "--display-name", "Python 3 (course)",
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


def cmd_lab(args):
    cmd_sync()
    install_lab_settings()
    ensure_dot()
    root = workspace.workspace_dir()
    argv = [sys.executable, "-m", "jupyter", "lab", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.root_dir={root}", "--LabApp.default_url=/lab/tree/notebooks/00_welcome.ipynb"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")
    argv += args.jupyter_args
    os.execv(sys.executable, argv)


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
    return args.fn(args) or 0


if __name__ == "__main__":
    sys.exit(main())
