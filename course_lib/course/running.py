"""Running a notebook headless, as the `course` commands do: `course check` runs the learner's exercise
notebook and reports each check as it finishes; `course execute` re-runs a solutions/ notebook as a
learner's would run, from a fresh workspace."""

import os
import tempfile
import time
from pathlib import Path

from course_lib.course import CourseError, exercises, nbtools
from course_lib.course.workspace.copies import read_notebook


def _error_line(cell):
    errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
    return f"{errors[0].ename}: {errors[0].evalue}" if errors else ""


def check_notebook(path, timeout=600, report=None):
    """Run a notebook headless in its own folder; return [(check name, passed, message, seconds)].

    report(name, passed, message, seconds) is called as each check finishes. Once a check has failed,
    the closing cells that run the chapter's pieces together (tagged "payoff") are skipped: they would
    only fail again, slowly."""
    from jupyter_client.kernelspec import NoSuchKernel

    nb, results, started = read_notebook(path), [], time.monotonic()

    def skip(cell):
        return any(not ok for _, ok, _, _ in results) and "payoff" in cell.metadata.get("tags", [])

    try:
        for _, cell in nbtools.run_cells(nb, cwd=path.parent, timeout=timeout, allow_errors=True, skip=skip):
            if not exercises.is_check(cell):
                continue
            msg, seconds = _error_line(cell), time.monotonic() - started
            for name in exercises.CHECK_CALL.findall(cell.source):
                results.append((name, not msg, msg, seconds))
                if report:
                    report(name, not msg, msg, seconds)
            started = time.monotonic()
    except NoSuchKernel:
        raise CourseError(f"the course's Jupyter kernel ({nbtools.KERNEL['name']}) is not installed here: "
                          "run `course setup`, then this command again") from None
    return results


def execute_as_learner(path, timeout=600):
    """Run a solved exercise notebook as a learner's: from exercises/ of a fresh temporary workspace,
    so its checks save the answers as the learner's and its closing cells run on them."""
    previous = os.environ.get("COURSE_WORKSPACE")
    with tempfile.TemporaryDirectory(prefix="course-workspace-") as tmp:
        folder = Path(tmp) / "exercises"
        folder.mkdir()
        os.environ["COURSE_WORKSPACE"] = tmp
        try:
            return nbtools.execute(read_notebook(path), cwd=folder, timeout=timeout)
        finally:
            if previous is None:
                os.environ.pop("COURSE_WORKSPACE", None)
            else:
                os.environ["COURSE_WORKSPACE"] = previous
