"""What the benchmarks share: the thread counts they run with, and how they time a contestant.

Import this module first, before numpy, torch or Numba: their thread pools read the thread count
from the environment once, when they start.

    import common                       # benchmarks/ is the script's folder, so this finds this file
    THREADS = common.pin_threads()      # --threads N on the command line, else 1
    import numpy as np, torch           # now they start with THREADS threads

Two ways to time, for two kinds of question:
- `compare` (course_lib.timing's): contestants in turns, a median per contestant; the ratio of two
  ways of doing one thing, on a machine that may be busy;
- `best_of`: the best of several timings of one function, each long enough to be measured; the
  machine's best figure for it, with `time.process_time` as the clock when other work shares it;
- `best_in_turns`: contestants in turns, the best round of each; for calls of milliseconds or more.
"""

import os
import sys
import time

from course_lib.timing import compare  # noqa: F401  (re-exported: benchmarks time contestants with it)

# Idle OpenMP threads (torch's, Numba's) spin by default, on the cores the next contestant needs, and
# their spinning counts as its CPU time. Passive waiting, as in the course's Jupyter kernel, avoids both.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def threads_from_argv(default=1):
    """--threads N from the command line, read before argparse runs (the pools start before it)."""
    args = sys.argv[1:]
    return int(args[args.index("--threads") + 1]) if "--threads" in args else default


def pin_threads(default=1):
    """Give numpy's BLAS, OpenMP (torch's) and Numba the same number of threads, and return it."""
    threads = threads_from_argv(default)
    if all(os.environ.get(v) == str(threads) for v in THREAD_VARIABLES):
        return threads                   # pinned already (a benchmark that imports another)
    started = sorted(m for m in ("numpy", "torch", "numba") if m in sys.modules)
    if started:
        raise RuntimeError(f"import common before {', '.join(started)}: their thread pools have started")
    for variable in THREAD_VARIABLES:
        os.environ[variable] = str(threads)
    return threads


def best_of(fn, repeat=5, clock=time.perf_counter, min_seconds=0.05):
    """Seconds per call of fn: the best of `repeat` timings, each over enough calls to last
    `min_seconds` (after one warm-up call, which compiles a kernel or fills a cache)."""
    fn()
    calls = 1
    while True:
        start = clock()
        for _ in range(calls):
            fn()
        if clock() - start >= min_seconds or calls >= 1 << 16:
            break
        calls *= 2
    best = float("inf")
    for _ in range(repeat):
        start = clock()
        for _ in range(calls):
            fn()
        best = min(best, (clock() - start) / calls)
    return best


def best_in_turns(contestants, rounds):
    """{name: best seconds per call}: every contestant called once per round, in turns, after one
    warm-up call each (a kernel compiles then)."""
    for run in contestants.values():
        run()
    best = dict.fromkeys(contestants, float("inf"))
    for _ in range(rounds):
        for name, run in contestants.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best
