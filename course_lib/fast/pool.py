"""How many threads a kernel call runs on: the one thread policy of the Numba backends.

Starting a parallel loop wakes Numba's thread pool, which costs microseconds on an idle machine and
milliseconds on a busy one. For small work one thread is faster, so each call picks its thread count
from the amount of work: one thread below PARALLEL_MIN elements, the whole pool above.
"""

import numba

PARALLEL_MIN = 1 << 17  # elements below which one thread is faster
POOL = numba.config.NUMBA_NUM_THREADS  # the threads Numba started with


def use_pool(work):
    """Whether a call this big runs a kernel's parallel flavour."""
    return work >= PARALLEL_MIN and POOL > 1


def set_threads(work):
    """One thread for small work, the whole pool for big work (switched only when it changes)."""
    count = 1 if work < PARALLEL_MIN else POOL
    if count != numba.get_num_threads():
        numba.set_num_threads(count)
