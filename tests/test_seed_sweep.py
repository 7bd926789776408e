"""The checks against wrong implementations, under 50 seeds: every mistake must be caught on
every draw, not on a lucky one. Opt-in (it runs those files 50 times): `make sweep`."""

import os
import subprocess
import sys

import pytest

from course_lib import REPO_DIR

SEEDS = range(1, 51)


@pytest.mark.slow
def test_every_wrong_implementation_is_rejected_under_every_seed():
    files = sorted(str(p) for p in (REPO_DIR / "tests").glob("test_ch[0-9][0-9]_checks.py"))
    failures = []
    for seed in SEEDS:
        env = {**os.environ, "COURSE_CHECK_SEED": str(seed), "OMP_NUM_THREADS": "1"}
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                              "-n", "2", *files], cwd=REPO_DIR, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            failures.append(f"seed {seed}:\n{run.stdout[-3000:]}")
    assert not failures, f"{len(failures)} of {len(SEEDS)} seeds failed:\n" + "\n".join(failures)
