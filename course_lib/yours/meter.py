"""Whose code computed a training step: the calls that compute numbers, counted and timed by owner.

A training step on the course's library is Python that decides what to compute (the Functions'
bookkeeping, autograd's walk, views, the optimizer's loop) around calls that compute: a backend kernel,
or numpy inside a piece such as an embedding's scatter-add or your `adam_step`. The meter wraps those
calls. `leaf(whose, name, fn, *args)` runs fn and books its time to (whose, name). A call that itself
makes metered calls (a Function whose forward runs kernels) is not a computation of its own: only the
time between its inner calls is booked to it, as Python around them, and it does not count as a call.

    meter = Meter()
    backend.meter = meter              # the backend books its kernels (numba_backend.py)
    ... one training step ...
    meter.calls[("yours", "flat_zip")], meter.seconds[("course", "where")], meter.python
"""

import collections
import time


class Meter:
    def __init__(self):
        self.calls = collections.Counter()    # (whose, name) -> computing calls
        self.seconds = collections.Counter()  # (whose, name) -> their seconds
        self.python = collections.Counter()   # (whose, name) -> seconds of a wrapper's own Python
        self._open = []                       # [seconds, calls] of inner metered calls, per open call

    def leaf(self, whose, name, fn, *args, **kwargs):
        """fn(*args, **kwargs), booked to (whose, name)."""
        self._open.append([0.0, 0])
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - start
            inner_seconds, inner_calls = self._open.pop()
            if inner_calls:
                self.python[(whose, name)] += elapsed - inner_seconds
            else:
                self.calls[(whose, name)] += 1
                self.seconds[(whose, name)] += elapsed
            if self._open:
                self._open[-1][0] += elapsed
                self._open[-1][1] += 1

    def wrap(self, whose, name, fn):
        """fn, metered under (whose, name)."""
        def metered(*args, **kwargs):
            return self.leaf(whose, name, fn, *args, **kwargs)
        return metered

    def total(self, whose=None):
        """(calls, seconds) of the computing calls of `whose` (None: everyone's)."""
        keys = [k for k in self.calls if whose is None or k[0] == whose]
        return sum(self.calls[k] for k in keys), sum(self.seconds[k] for k in keys)
