"""Timing that a busy laptop cannot turn upside down.

A lesson that times two ways of doing one thing runs them in turns: a round calls each contestant
once (each call repeated until it lasts a few milliseconds), and each contestant's figure is its
median over the rounds. When the machine gets busy for a moment, every contestant of that round
slows down alike, and the median ignores the slow rounds. A single `perf_counter` around one call
measures the machine's load as much as the code.

    from course_lib.timing import compare
    ms = compare({"loop": lambda: loop(x), "numpy": lambda: np.tanh(x)})   # {name: ms per call}
"""

import statistics
import time


def _calls_for(fn, seconds):
    """How many calls of fn take at least `seconds` (fn is called at least once, as a warm-up)."""
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - start >= seconds or n >= 1 << 20:
            return n
        n *= 2


def compare(contestants, rounds=7, round_time=0.005):
    """Median milliseconds per call of each contestant, their calls interleaved round by round.

    contestants: {name: function of no arguments}. Each is called once first (a warm-up: a Numba
    kernel compiles, a cache fills), then in `rounds` rounds, in a rotating order."""
    names = list(contestants)
    calls = {name: _calls_for(contestants[name], round_time) for name in names}
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn, n = contestants[name], calls[name]
            start = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - start) / n)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}
