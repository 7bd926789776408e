"""How much memory attention allocates while it runs: tiles for the tiled kernel, O(T^2) for naive attention.

    measure("fused", T)                          the most bytes one forward held at once, beyond its outputs
    memory_curve([256, 512, 1024])               {"fused": [bytes at each T], "naive": [...]}

The measuring tools (`peak_bytes`, and `growth` to fit a curve) are course_lib/memory.py's; this file
picks the contestants.
tracemalloc does not see PyTorch's allocator, so both work on numpy arrays: the course's Numba kernel
(attention_cpu.forward_kernel, its outputs allocated before the measurement starts) and naive attention
written with numpy, which builds the (H, T, T) scores and their softmax as chapter 04's attention does.
"""

import numpy as np

from course_lib.fused import attention_cpu
from course_lib.memory import peak_bytes


def naive_attention(q, k, v, causal):
    """softmax(q k^T / sqrt(d)) v on numpy arrays (H, T, d), with the (H, Tq, Tk) scores in memory."""
    s = q @ k.transpose(0, 2, 1) * q.shape[2] ** -0.5
    if causal:
        Tq, Tk = s.shape[1:]
        s[:, np.triu(np.ones((Tq, Tk), bool), Tk - Tq + 1)] = -np.inf
    s = np.exp(s - s.max(-1, keepdims=True))
    return s / s.sum(-1, keepdims=True) @ v


def _inputs(T, H, d, dtype, seed):
    g = np.random.default_rng(seed)
    return tuple(g.standard_normal((H, T, d)).astype(dtype) for _ in range(3))


def measure(method, T, H=4, d=64, causal=True, dtype=np.float32):
    """Peak extra bytes of one forward of `method` ("fused" or "naive") at sequence length T."""
    q, k, v = _inputs(T, H, d, dtype, seed=T)
    if method == "fused":
        out, lse = np.empty_like(q), np.empty(q.shape[:2], dtype)
        scale = q.dtype.type(d ** -0.5)
        return peak_bytes(lambda: attention_cpu.forward_kernel(q, k, v, out, lse, scale, causal,
                                                               *attention_cpu.FORWARD_TILES))
    return peak_bytes(lambda: naive_attention(q, k, v, causal))


def memory_curve(Ts=(256, 512, 1024), methods=("fused", "naive"), H=4, d=64, causal=True):
    """{method: [peak extra bytes at each T]} for one forward, float32."""
    return {method: [measure(method, T, H, d, causal) for T in Ts] for method in methods}


def matrix_bytes(T, H=4, itemsize=4):
    """The bytes of one (H, T, T) matrix: what naive attention allocates several of."""
    return H * T * T * itemsize

