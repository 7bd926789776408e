"""Weight-only int8: each output channel's weights as int8 with one float32 scale, used without a float copy.

A decode step at a small batch reads every weight once per token and does two flops with it: the weights'
bytes, not the arithmetic, set the time. Storing them as int8 moves a quarter of the bytes. Each output
channel (row of the (out, in) weight) gets its own scale, max |w| / 127, so that a row of small weights
is not rounded to zeros by a row of large ones. The matmul multiplies by the int8 numbers as it reads
them and applies the row's scale once at the end: the float32 weight matrix never exists.
"""

import numba
import numpy as np
from numba import prange


def quantize(w):
    """The course's answer to exercise 14.5 (`int8_linear`): read it once your check passes.

    w (out, in) float -> (int8 (out, in), float32 scales (out,)), with w ~ q * scales[:, None]."""
    scale = np.abs(w).max(axis=1) / 127.0
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)      # an all-zero row: any scale will do
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


# Below this many multiply-adds a product runs on the calling thread: waking the other threads of a
# parallel loop costs tens of microseconds, more than a decode step's product takes on one core.
PARALLEL_FROM = 1 << 21


@numba.njit(fastmath=True, cache=True)
def output_channel(x, q, scale, out, j):
    """The course's answer to exercise 14.5 (`int8_linear`): read it once your check passes.

    Column j of out: output channel j for every row of x, its int8 weight row read once and dequantized
    as it is read."""
    n, k = x.shape
    for i in range(n):
        acc = np.float32(0.0)
        for c in range(k):
            acc += x[i, c] * np.float32(q[j, c])
        out[i, j] = acc * scale[j]


@numba.njit(parallel=True, fastmath=True, cache=True)
def int8_matmul(x, q, scale, out):
    """The course's answer to exercise 14.5 (`int8_linear`): read it once your check passes.

    out (n, out) = x (n, in) @ (q * scale[:, None]).T, an output channel at a time."""
    if x.shape[0] * q.size < PARALLEL_FROM:            # small: on this thread
        for j in range(q.shape[0]):
            output_channel(x, q, scale, out, j)
        return
    for j in prange(q.shape[0]):                       # one output channel per task: its row read once
        output_channel(x, q, scale, out, j)
