"""Warp shuffles for Numba's CUDA simulator, so that the chapter's CUDA kernels run unchanged without a GPU.

On a GPU the 32 threads of a warp can read each other's registers: `cuda.shfl_xor_sync(mask, x, 4)`
returns the x of the lane whose number differs from the caller's in bit 2, in one instruction and
without shared memory. Attention uses it for each row's max and sum, whose columns are spread over a few
lanes. Numba's simulator runs every thread as a Python thread and has no shuffles (numba-cuda 0.30);
`teach_simulator()` gives it `shfl_sync`, `shfl_xor_sync` and `syncwarp` with the GPU's meaning:

- every lane of the warp calls the shuffle (as on a GPU, where `mask` names them all);
- each lane leaves its value in a slot, waits until the whole warp has done so (a barrier of the warp's
  threads), and reads the slot of its partner. Two slot arrays take turns, so that a fast lane's next
  shuffle never overwrites a value a slow lane has not read yet.

A lane that skips a shuffle its warp-mates call would hang a GPU; here the barrier times out and says so.
`fast_switching()` makes the simulator's barriers cheaper: its block manager polls the threads in a loop,
and a shorter interpreter switch interval hands the woken threads the interpreter sooner.
"""

import contextlib
import sys
import threading

from numba import config

WARP = 32
TIMEOUT = 60            # seconds a lane waits for its warp-mates before the shuffle is declared stuck

_lock = threading.Lock()


class _Warp:
    """The meeting point of one warp's lanes: a barrier and two arrays of slots used in turns."""

    def __init__(self, lanes):
        self.barrier = threading.Barrier(lanes, timeout=TIMEOUT)
        self.slots = ([None] * WARP, [None] * WARP)


def _warp_of(thread):
    """(the thread's warp, its lane); warps live on the launch's block manager, one per 32 threads."""
    manager, tid = thread._manager, thread.thread_id
    base = tid - tid % WARP
    with _lock:
        warps = manager.__dict__.setdefault("_course_warps", {})
        if base not in warps:
            size = 1
            for n in manager._block_dim:
                size *= n
            warps[base] = _Warp(min(WARP, size - base))
    return warps[base], tid % WARP


def _wait(warp, what):
    try:
        warp.barrier.wait()
    except threading.BrokenBarrierError:
        raise RuntimeError(f"{what}: not every lane of the warp reached it within {TIMEOUT} s (one of them "
                           f"returned early, or took another branch); on a GPU this hangs") from None


def _exchange(value, source_lane, what):
    thread = threading.current_thread()
    warp, lane = _warp_of(thread)
    turn = thread.__dict__.get("_course_turn", 0)
    thread._course_turn = 1 - turn
    slots = warp.slots[turn]
    slots[lane] = value
    _wait(warp, what)
    got = slots[source_lane(lane) % WARP]
    return value if got is None else got     # a lane past the block's last thread: its own value, as on a GPU


def shfl_sync(self, mask, value, src_lane):
    """The value of lane `src_lane` of the caller's warp."""
    return _exchange(value, lambda lane: src_lane, "shfl_sync")


def shfl_xor_sync(self, mask, value, lane_mask):
    """The value of lane (caller's lane XOR lane_mask): the butterfly step of a warp reduction."""
    return _exchange(value, lambda lane: lane ^ lane_mask, "shfl_xor_sync")


def syncwarp(self, mask=0xFFFFFFFF):
    """Wait for the other lanes of the warp."""
    warp, _ = _warp_of(threading.current_thread())
    _wait(warp, "syncwarp")


def teach_simulator():
    """Give the simulator's stand-in for numba.cuda the warp functions it lacks (once; nothing on a GPU)."""
    if not config.ENABLE_CUDASIM:
        return
    from numba.cuda.simulator import kernelapi

    module = kernelapi.FakeCUDAModule
    for name, fn in (("shfl_sync", shfl_sync), ("shfl_xor_sync", shfl_xor_sync), ("syncwarp", syncwarp)):
        if not hasattr(module, name):
            setattr(module, name, fn)


@contextlib.contextmanager
def fast_switching(interval=5e-5):
    """On the simulator, switch Python threads every `interval` seconds while the block runs (then restore)."""
    if not config.ENABLE_CUDASIM:
        yield
        return
    before = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        yield
    finally:
        sys.setswitchinterval(before)
