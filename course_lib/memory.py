"""Memory that a call allocates while it runs, and how it grows with the problem's size.

    from course_lib.memory import peak_bytes, growth
    peak_bytes(lambda: f(x))            # the most bytes f held at once, beyond what it returned
    growth([256, 512, 1024], sizes)     # p in sizes ~ T^p: 1 for tiles, 2 for a (T, T) matrix

The measurement is `tracemalloc`, Python's allocation tracer, the same on Linux, macOS and Windows. It
sees every array numpy allocates and every array a Numba kernel allocates (both go through Python's
memory hooks), on any thread; it does not see PyTorch's own allocator, so measure numpy arrays.

Compiling a kernel allocates tens of MB: run the call once before measuring (warm_up=True does).
A curve over a few sizes, not one figure, says how memory scales: a fixed overhead (a few tile buffers,
Numba's task scheduling) cannot change the exponent.
"""

import tracemalloc

import numpy as np


def peak_bytes(fn, warm_up=True):
    """The peak of the bytes numpy and Numba held while fn() ran, above what they held before it.
    Works inside another measurement too: tracing already on stays on."""
    if warm_up:
        fn()                                     # compile, and let every cache fill, outside the measurement
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        if not was_tracing:
            tracemalloc.stop()


def growth(Ts, sizes):
    """The exponent p of the least-squares fit sizes ~ c T^p, in log-log coordinates."""
    x, y = np.log(np.asarray(Ts, float)), np.log(np.maximum(np.asarray(sizes, float), 1.0))
    return float(np.polyfit(x, y, 1)[0])
