"""`course`: the learner's command line.

    course lab            set up work/ and start JupyterLab on chapter 00
    course status         every chapter's exercises: passed, failed or not started, and whose code runs
    course check NN       run your exercise notebook NN headless and report each check
    course reset NN       fresh exercise notebook NN (yours is backed up first); --lesson for the lesson
    course sync           copy new or updated course notebooks into work/
    course setup          one-time setup: Jupyter kernel, Graphviz, work/
    course build [--check]    (course authors) exercises/ from solutions/, and every notebook's Colab and Binder
                              cells and the README's badges from pyproject.toml's Repository (links.py)
    course stage DIR          (course authors) a workspace in DIR with the lessons and solved exercises
    course execute PATH...    (course authors) re-run notebooks in place (solutions/ as a learner would)
    course new SCRIPT OUT     (course authors) a notebook from a percent-format script
    course serve [--port N]   chapter 14's GPT behind an OpenAI-compatible server on 127.0.0.1
                              (its options: `course serve --help`; course_lib/serve/cli.py)
"""

import argparse
import sys
import time
from pathlib import Path

from course_lib import CHECKOUT, REPO_DIR
from course_lib.course import STARTED, CourseError, environment, exercises, lab, links, nbtools, running
from course_lib.course.printing import GREEN, RED, paint, say, wrap
from course_lib.course.workspace import copies, mirror, reset, stage, sync
from course_lib.fast.cache import drop_stale_kernels
from course_lib.learner import answers, progress


def cmd_sync(args=None):
    report = sync.sync()
    for what, path in report:
        say(f"{what}: {copies.shown(path)}")
    mirror.mirror_library()
    if not report:
        say(f"{copies.shown(progress.workspace_dir())}/ is up to date with the course: nothing to copy or update.")
    elif any(what.startswith("updated") for what, _ in report):
        say("If JupyterLab has one of these notebooks open, choose Revert when it says the file changed on disk "
            "(or File > Reload Notebook from Disk): Overwrite would write back the version before the update, "
            "which the next `course sync` brings in again.")


def cmd_status(args):
    """A table: one row per exercise, grouped by chapter, then a count per chapter. "code used" says
    whether later chapters run your saved code (work/yours/) or the course's. A failed check's message
    follows its row, wrapped, never cut."""
    done = progress.load()
    rows, counts = [], []
    for _, ex in exercises.pairs():
        results, saved = done.get(ex.name[:2], {}), answers.index(ex.name[:2])
        names = exercises.check_names(nbtools.read(ex))
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
            print(wrap(note, " " * (w_ch + 2), lines=3))
    print(rule)
    print("  ".join(f"{c[:2]}: {p}/{n}" for c, p, n in counts))
    print(f"{sum(p for _, p, _ in counts)} of {sum(n for _, _, n in counts)} exercises passed.")


def cmd_check(args):
    path = progress.workspace_dir() / "exercises" / copies.find(args.chapter).name
    chapter = path.name[:2]
    if not path.exists():
        cmd_sync()
        say(f"{copies.shown(path)} was not there, so `course sync` made a fresh copy: fill in its "
            f"exercises in JupyterLab (`course lab`), then run `course check {chapter}` again.")
        return 1
    total = len(exercises.check_names(copies.read_notebook(path)))
    say(f"running {copies.shown(path)} ({total} checks; each line appears as its check finishes)")
    done = []

    def report(name, ok, msg, seconds):
        done.append(ok)
        print(f"  [{len(done)}/{total}] {paint('passed', GREEN) if ok else paint('failed', RED)}  {name}  "
              f"({seconds:.1f} s)", flush=True)
        if ok and name in answers.index(chapter):
            say(f"kept in work/yours/ch{chapter}.py{answers.used_by(chapter)}", "          ")
        if msg:
            say(msg, "          ", lines=8)

    results = running.check_notebook(path, report=report)
    n = sum(ok for _, ok, _, _ in results)
    skipped = " The chapter's closing cells were skipped: they run once every check passes." if n < len(results) else ""
    say(f"{n} of {len(results)} checks passed in {time.monotonic() - args.started:.0f} s, "
        f"from the command's start.{skipped}")
    return 0 if n == len(results) else 1


def cmd_reset(args):
    kind = "notebooks" if args.lesson else "exercises"
    saved = reset.reset(args.chapter, kind)
    say(f"fresh copy: {copies.shown(progress.workspace_dir() / kind / copies.find(args.chapter, kind).name)}")
    say(f"your previous copy is saved as {copies.shown(saved)}" if saved else "(there was no previous copy)")


def cmd_build(args):
    problems = {s.name: exercises.lint(nbtools.read(s)) for s, _ in exercises.pairs()}
    problems |= {f"notebooks/{p.name}": exercises.lint_lesson(nbtools.read(p), p.name)
                 for p in sorted((REPO_DIR / "notebooks").glob("[0-9][0-9]_*.ipynb"))}
    for name, found in problems.items():
        for p in found:
            print(f"{name}: {p}")
    stale = links.update(check_only=args.check) + exercises.build(check_only=args.check)  # launch cells first
    for path in stale:
        print(("out of date: " if args.check else "wrote ") + str(path.relative_to(REPO_DIR)))
    return 1 if (args.check and stale) or any(problems.values()) else 0


def cmd_execute(args):
    for p in map(Path, args.paths):
        if not p.is_file():
            raise CourseError(f"there is no notebook at {p}: give the path of a notebook, as in "
                              "`course execute solutions/00_warmup.ipynb`")
        if p.resolve().parent == (REPO_DIR / "solutions").resolve():
            nb = running.execute_as_learner(p, timeout=args.timeout)
        else:
            nb = nbtools.execute(copies.read_notebook(p), cwd=p.parent.resolve(), timeout=args.timeout)
        nbtools.write(nbtools.clean_metadata(nb), p)
        print(f"executed {p}")


def cmd_new(args):
    script = Path(args.script)
    if not script.is_file():
        raise CourseError(f"there is no script at {script}: `course new` reads a percent-format script "
                          "(see CONTRIBUTING.md) and writes the notebook OUT")
    nbtools.write(nbtools.from_script(script.read_text(encoding="utf-8")), args.out)


def cmd_stage(args):
    say(f"staged {stage.stage(args.folder)}")


def cmd_setup(args):
    environment.install_kernel()
    environment.install_lab_settings()
    environment.ensure_dot()
    cmd_sync()


def cmd_lab(args):
    cmd_sync()
    environment.install_lab_settings()
    environment.ensure_dot()
    return lab.serve(progress.workspace_dir(), args.jupyter_args)


# Every command but `new` reads the course's notebooks or writes beside them, so it needs the course's
# folder (a clone); a library that pip installed alone (a wheel, Colab) has none.
def cmd_serve(args):
    from course_lib.serve.cli import main as serve  # its options are its own

    return serve(args.extra)


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
    sub.add_parser("serve", add_help=False, help="options: course serve --help").set_defaults(fn=cmd_serve)
    args, extra = p.parse_known_args(argv)
    if extra and args.cmd not in ("lab", "serve"):
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    args.jupyter_args = args.extra = extra
    # the command line's own start; a call from Python (the tests) counts from here
    args.started = STARTED if argv is None else time.monotonic()
    if args.cmd in NEEDS_CHECKOUT and not CHECKOUT:
        print(needs_checkout(args.cmd), file=sys.stderr)
        return 2
    drop_stale_kernels()  # before any kernel runs here or in a notebook this command starts (fast/cache.py)
    try:
        return args.fn(args) or 0
    except CourseError as e:  # a problem the learner can fix: one line that says how, nothing lost
        say(f"course {args.cmd}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
