"""Attention that reads the keys and values where they are: in blocks scattered over the cache.

    paged_attention(q, k_cache, v_cache, block_tables, context_lens, out, scale)

q (N, H, d): one query row per token of the batch; k_cache, v_cache (num_blocks, block_size, H, d); row i
of block_tables lists the blocks of query i's sequence; query i sees its sequence's positions
0 .. context_lens[i] - 1. A decode step has one query per sequence; a prefill gives each prompt token a
row of its own, with the same block table and its own context length, so one kernel serves both.

One task per query, in parallel: it walks its sequence block by block through the table and folds each
block into an online softmax (chapter 10's running max, sum and weighted sum, one of each per head), so
that nothing of a sequence's length is ever gathered or stored: its memory is a block's scores and a few
rows of H x d numbers.

The layout decides the speed. In the cache, a position's keys for all heads are one contiguous row of
H * d numbers (1 KB for 8 heads of 32 in float32), and a block is block_size such rows, one after the
other. A task that owns one (query, head) would read 128 bytes out of every 1 KB row and leave the rest to
seven other tasks, each reading the block again; a task that owns a query and all its heads reads each row
once, front to back. And a decode step is a matrix-vector product per head: each key and value is used
once, so the kernel's speed is the speed of reading them, as long as the arithmetic keeps up. Per block:

    1. scores s[o, h] = (q[h] . k[o, h]) * scale for the block's positions o, all heads (scale is folded
       into a copy of q once per task);
    2. per head, the block's max; when it raises the running max m[h], the sum l[h] and acc[h] are moved
       to the new max (times exp(m_old - m_new)) once per block, not at every position;
    3. p[o, h] = exp(s[o, h] - m[h]), over a row of heads at a time, in place of the scores: the exponent
       is <= 0, so `exp_neg` (simd/fastexp.py, plain arithmetic) vectorizes where np.exp would not;
    4. acc[h] += p[o, h] * v[o, h], a row of d numbers at a time, contiguous in the cache.

Each output row is computed by one task, in one fixed order of positions, so the result does not depend
on the number of threads. The tasks run in a zigzag order of queries (0, N-1, 1, N-2, ...): a prefill's
rows see more and more positions, and any contiguous half of the tasks, which is what each of two cores
gets, then holds about half the work.
"""

import numba
import numpy as np
from numba import prange

from course_lib.simd.fastexp import exp_neg

FASTMATH = {"reassoc", "contract", "nsz", "arcp"}   # reorder sums (SIMD), fuse multiply-adds; keep inf and NaN


@numba.njit(inline="always")
def zigzag(t, n):
    """The t-th task to run of n: 0, n-1, 1, n-2, ... so that any contiguous half holds about half the work."""
    return t // 2 if t % 2 == 0 else n - 1 - t // 2


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def paged_attention(q, k_cache, v_cache, block_tables, context_lens, out, scale):
    """The course's answer to exercise 14.2 (`paged_attention`): read it once your check passes.

    out[i, h] = softmax over p < context_lens[i] of (q[i, h] . k[p, h]) * scale, times v[p, h], with the
    keys and values of position p at k_cache[block_tables[i, p // block_size], p % block_size]."""
    N, H, d = q.shape
    block_size = k_cache.shape[1]
    dtype = q.dtype
    for task in prange(N):
        i = zigzag(task, N)
        n = context_lens[i]
        qs = np.empty((H, d), dtype)                   # q[i] * scale: the scores come out scaled
        for h in range(H):
            for c in range(d):
                qs[h, c] = q[i, h, c] * scale
        s = np.empty((block_size, H), dtype)          # one block's scores, then its exp(s - m)
        m = np.full(H, -np.inf, dtype)                # per head: running max,
        l = np.zeros(H, dtype)                        # running sum of exp(s - m),
        acc = np.zeros((H, d), dtype)                 # running sum of exp(s - m) v
        top = np.empty(H, dtype)
        for b in range((n + block_size - 1) // block_size):
            keys, values = k_cache[block_tables[i, b]], v_cache[block_tables[i, b]]   # (block_size, H, d)
            count = min(block_size, n - b * block_size)                              # the last block: fewer
            for o in range(count):                    # 1. scores, a row of the cache at a time
                for h in range(H):
                    dot = dtype.type(0)
                    for c in range(d):
                        dot += qs[h, c] * keys[o, h, c]
                    s[o, h] = dot
            top[:] = m                                # 2. the block's max, and the old sums moved to it
            for o in range(count):
                for h in range(H):
                    top[h] = max(top[h], s[o, h])
            for h in range(H):
                rescale = exp_neg(m[h] - top[h])      # 0 at the first block (m = -inf): nothing was summed
                m[h], l[h] = top[h], l[h] * rescale
                for c in range(d):
                    acc[h, c] *= rescale
            for o in range(count):                    # 3. weights, in place of the scores
                for h in range(H):
                    s[o, h] = exp_neg(s[o, h] - m[h])
                    l[h] += s[o, h]
            for o in range(count):                    # 4. the weighted values, a row of the cache at a time
                for h in range(H):
                    w = s[o, h]
                    for c in range(d):
                        acc[h, c] += w * values[o, h, c]
        for h in range(H):
            for c in range(d):
                out[i, h, c] = acc[h, c] / l[h]
