"""Keep freed memory for the next run: the engine's arena, borrowed from the C library's malloc.

Every kernel returns a fresh numpy array. glibc's malloc serves big blocks (from 128 KiB) with mmap and
hands them back to the system on free, so each run's arrays land on fresh pages, and the first write to
each 4 KiB page costs a page fault. On the GPT at batch 32 that is thousands of faults, a third of the run.
Raising malloc's mmap and trim thresholds keeps freed blocks in the heap, where the next array of the same
size finds them already mapped. onnxruntime does the same with its own arena (enable_cpu_mem_arena).
"""

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # mallopt's parameter numbers, from glibc's malloc.h
BIGGEST = 32 << 20                            # glibc's largest mmap threshold on 64-bit systems


def keep_freed_memory():
    """Make malloc reuse freed blocks up to 32 MiB instead of unmapping them. Process-wide; glibc only.

    Returns True when it took effect (False elsewhere, e.g. macOS: nothing changes, nothing breaks)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, BIGGEST)) and bool(mallopt(M_TRIM_THRESHOLD, 4 * BIGGEST))
