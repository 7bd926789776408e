"""Test-suite wiring: GPU-only tests are skipped visibly, and listed at the end of the run; under xdist
(`make test`), the tests run in groups, longest first (tests/worker_groups.py)."""

import os

import carried
import pytest
import worker_groups

from course_lib import device
from course_lib.fast.cache import drop_stale_kernels

# Choose the GPU or the simulator before any test module imports numba.cuda: Numba reads the
# choice once, so a test file whose imports (sorted by the linter) load numba.cuda first would
# otherwise fix it too early.
device.setup(verbose=False)
# Numba's saved kernels, of every package, dropped if a file they inline changed since they were compiled
# (fast/cache.py).
drop_stale_kernels()


def pytest_configure(config):
    # a plugin's hooks see every test's report (a conftest's, only those of tests below its folder): the
    # staged solution notebooks' runs under nbval, whose saves carried.py copies
    config.pluginmanager.register(carried.SolutionRuns(), "carried-solution-runs")


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run the tests marked slow (the seed sweep)")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items[:] = worker_groups.longest_first(items)
    carried.expect_solution_runs(items)
    if not config.getoption("--slow"):
        opt_in = pytest.mark.skip(reason="slow, opt-in: run with --slow (make sweep)")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(opt_in)
    if device.gpu_present():
        return
    skip = pytest.mark.skip(reason="needs a real CUDA GPU; none found, so CUDA code was tested on the simulator")
    for item in items:
        if item.get_closest_marker("gpu"):     # the marker, not the keyword: a folder named gpu is a keyword too
            item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") == "loadfile":
        return worker_groups.GroupScheduling(config, log)


def pytest_terminal_summary(terminalreporter):
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "needs a real CUDA GPU" in str(r.longrepr)]
    if skipped:
        terminalreporter.write_line(
            f"GPU-only tests skipped: {len(skipped)} (no GPU on this machine; "
            "the CUDA code ran on Numba's simulator instead)", yellow=True)


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """An empty learner workspace in a temporary folder."""
    work = tmp_path / "work"
    monkeypatch.setenv("COURSE_WORKSPACE", str(work))
    monkeypatch.delenv("COURSE_PROGRESS_FILE", raising=False)
    return work


@pytest.fixture(scope="session")
def in_ci():
    return bool(os.environ.get("CI"))
