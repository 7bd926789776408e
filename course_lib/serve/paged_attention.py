"""Attention that reads the keys and values where they are: in blocks scattered over the cache.

    paged_attention(q, k_cache, v_cache, block_tables, context_lens, out, scale)

q (N, H, d): one query row per token of the batch; k_cache, v_cache (num_blocks, block_size, H, d); row i
of block_tables lists the blocks of query i's sequence; query i sees its sequence's positions
0 .. context_lens[i] - 1. A decode step has one query per sequence; a prefill gives each prompt token a
row of its own, with the same block table and its own context length, so one kernel serves both.

One task per (query, head), in parallel: it walks the positions block by block through the table and
folds each key into an online softmax (chapter 10's running max, sum and weighted sum), so that nothing
of a sequence's length is ever gathered or stored: its memory is a few rows of d numbers.
"""

import numba
import numpy as np
from numba import prange


@numba.njit(parallel=True, fastmath={"reassoc", "contract", "nsz", "arcp"}, cache=True)
def paged_attention(q, k_cache, v_cache, block_tables, context_lens, out, scale):
    """The course's answer to exercise 14.2 (`paged_attention`): read it once your check passes.

    out[i, h] = softmax over p < context_lens[i] of (q[i, h] . k[p, h]) * scale, times v[p, h], with the
    keys and values of position p at k_cache[block_tables[i, p // block_size], p % block_size]."""
    N, H, d = q.shape
    block_size = k_cache.shape[1]
    for task in prange(N * H):
        i, h = task // H, task % H
        acc = np.zeros(d, q.dtype)
        m, l = -np.inf, q.dtype.type(0)
        for p in range(context_lens[i]):
            block, offset = block_tables[i, p // block_size], p % block_size
            s = q.dtype.type(0)
            for c in range(d):
                s += q[i, h, c] * k_cache[block, offset, h, c]
            s *= scale
            if s > m:                                  # a new max: rescale what was summed so far
                rescale = np.exp(m - s)
                l *= rescale
                for c in range(d):
                    acc[c] *= rescale
                m = s
            w = np.exp(s - m)
            l += w
            for c in range(d):
                acc[c] += w * v_cache[block, offset, h, c]
        for c in range(d):
            out[i, h, c] = acc[c] / l
