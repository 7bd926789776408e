"""Tiled attention with an online softmax as Numba CUDA kernels: the same algorithm as attention_cpu.py.

This file holds the course's answer to exercise 10.5 (`flash_forward_cuda`: the forward kernel inside
`kernels`). Read it once your check passes.

One block per (head, tile of TILE rows), one thread per row. In the forward, thread t owns query row
i = tile * TILE + t: its q row, its running max m, its running sum l and its output accumulator
live in registers (`cuda.local.array`). The block walks over the keys a tile at a time; each thread
loads one key row and one value row into shared memory, so every key is read from global memory
once per block and then used by all TILE queries. After a tile each thread updates its own row:

    m' = max(m, scores);  l = l * exp(m - m') + sum exp(s - m');  acc = acc * exp(m - m') + sum exp(s - m') v

No thread ever holds more than a row of TILE scores, and the T x T matrix never exists.

The backward recomputes P = exp(s * scale - lse) instead of storing it (reading a T x T matrix
back from memory would cost more than recomputing it). `dkdv_kernel` gives each thread a key row
and walks the query tiles (dK, dV sum over queries); `dq_kernel` gives each thread a query row and
walks the key tiles (dQ sums over keys). Each output row has a single owner: no atomics.

A teaching kernel, not a fast one: production kernels give a tile to a warp and run the two
matmuls on tensor cores. It shows where each number lives (global, shared, registers) and runs on
Numba's simulator at small sizes: there, every thread is a Python thread (about 130 µs each).
Shared and local arrays need sizes known at compile time, hence TILE and D_MAX, and a dtype:
`kernels(dtype)` compiles the three kernels for float32 or float64.
"""

import functools
import math

from course_lib import device

device.setup(verbose=False)

import numba  # noqa: E402
import torch  # noqa: E402
from numba import cuda  # noqa: E402  (after the device is chosen)

from course_lib.custom_ops.numba_cuda import kernel_view  # noqa: E402

TILE = 16    # rows per block, one thread each
D_MAX = 64   # the largest head size: each thread keeps rows of up to D_MAX numbers in registers


@functools.cache
def kernels(dtype):
    """The course's answer to exercise 10.5 (`flash_forward_cuda`): read it once your check passes.

    The forward (the exercise), dK/dV and dQ kernels for one numba dtype (float32 or float64)."""

    @cuda.jit
    def forward_kernel(q, k, v, out, lse, scale, causal):
        h, i0, t = cuda.blockIdx.x, cuda.blockIdx.y * TILE, cuda.threadIdx.x
        Tq, d, Tk, dv = q.shape[1], q.shape[2], k.shape[1], v.shape[2]
        i, offset = i0 + t, Tk - Tq
        k_tile = cuda.shared.array((TILE, D_MAX), dtype)
        v_tile = cuda.shared.array((TILE, D_MAX), dtype)
        q_row = cuda.local.array(D_MAX, dtype)
        acc = cuda.local.array(D_MAX, dtype)
        s = cuda.local.array(TILE, dtype)
        for c in range(d):
            q_row[c] = q[h, i, c] * scale if i < Tq else 0
        for c in range(dv):
            acc[c] = 0
        m, denom = dtype(-math.inf), dtype(0)                    # running max and sum of this row
        k_end = min(Tk, i0 + TILE + offset) if causal else Tk     # the same for the whole block
        for j0 in range(0, k_end, TILE):
            if j0 + t < Tk:                                        # each thread loads one key and value
                for c in range(d):
                    k_tile[t, c] = k[h, j0 + t, c]
                for c in range(dv):
                    v_tile[t, c] = v[h, j0 + t, c]
            cuda.syncthreads()
            if i < Tq:
                n = min(TILE, Tk - j0, i + offset + 1 - j0) if causal else min(TILE, Tk - j0)
                m_new = m
                for j in range(n):
                    s[j] = 0
                    for c in range(d):
                        s[j] += q_row[c] * k_tile[j, c]
                    m_new = max(m_new, s[j])
                alpha = math.exp(m - m_new)                        # re-base the sums on the new max
                denom *= alpha
                for c in range(dv):
                    acc[c] *= alpha
                for j in range(n):
                    p = math.exp(s[j] - m_new)
                    denom += p
                    for c in range(dv):
                        acc[c] += p * v_tile[j, c]
                m = m_new
            cuda.syncthreads()                                     # before the next tile overwrites these
        if i < Tq:
            for c in range(dv):
                out[h, i, c] = acc[c] / denom
            lse[h, i] = m + math.log(denom)

    @cuda.jit
    def dkdv_kernel(q, k, v, do, lse, delta, dk, dv, scale, causal):
        h, j0, t = cuda.blockIdx.x, cuda.blockIdx.y * TILE, cuda.threadIdx.x
        Tq, d, Tk, dvs = q.shape[1], q.shape[2], k.shape[1], v.shape[2]
        j, offset = j0 + t, Tk - Tq
        q_tile = cuda.shared.array((TILE, D_MAX), dtype)
        do_tile = cuda.shared.array((TILE, D_MAX), dtype)
        lse_tile = cuda.shared.array(TILE, dtype)
        delta_tile = cuda.shared.array(TILE, dtype)
        k_row, v_row = cuda.local.array(D_MAX, dtype), cuda.local.array(D_MAX, dtype)
        dk_row, dv_row = cuda.local.array(D_MAX, dtype), cuda.local.array(D_MAX, dtype)
        for c in range(d):
            k_row[c] = k[h, j, c] if j < Tk else 0
            dk_row[c] = 0
        for c in range(dvs):
            v_row[c] = v[h, j, c] if j < Tk else 0
            dv_row[c] = 0
        first = max(0, j0 - offset) // TILE * TILE if causal else 0   # earlier queries see none of these keys
        for i0 in range(first, Tq, TILE):
            if i0 + t < Tq:                                        # each thread loads one query's rows
                for c in range(d):
                    q_tile[t, c] = q[h, i0 + t, c]
                for c in range(dvs):
                    do_tile[t, c] = do[h, i0 + t, c]
                lse_tile[t], delta_tile[t] = lse[h, i0 + t], delta[h, i0 + t]
            cuda.syncthreads()
            for ii in range(min(TILE, Tq - i0)):
                if j < Tk and not (causal and j > i0 + ii + offset):
                    s = dtype(0)
                    for c in range(d):
                        s += q_tile[ii, c] * k_row[c]
                    p = math.exp(s * scale - lse_tile[ii])          # P recomputed from the saved lse
                    dp = dtype(0)
                    for c in range(dvs):
                        dv_row[c] += p * do_tile[ii, c]
                        dp += do_tile[ii, c] * v_row[c]
                    ds = p * (dp - delta_tile[ii])
                    for c in range(d):
                        dk_row[c] += ds * q_tile[ii, c]
            cuda.syncthreads()
        if j < Tk:
            for c in range(d):
                dk[h, j, c] = dk_row[c] * scale
            for c in range(dvs):
                dv[h, j, c] = dv_row[c]

    @cuda.jit
    def dq_kernel(q, k, v, do, lse, delta, dq, scale, causal):
        h, i0, t = cuda.blockIdx.x, cuda.blockIdx.y * TILE, cuda.threadIdx.x
        Tq, d, Tk, dv = q.shape[1], q.shape[2], k.shape[1], v.shape[2]
        i, offset = i0 + t, Tk - Tq
        k_tile = cuda.shared.array((TILE, D_MAX), dtype)
        v_tile = cuda.shared.array((TILE, D_MAX), dtype)
        q_row, do_row = cuda.local.array(D_MAX, dtype), cuda.local.array(D_MAX, dtype)
        dq_row = cuda.local.array(D_MAX, dtype)
        for c in range(d):
            q_row[c] = q[h, i, c] if i < Tq else 0
            dq_row[c] = 0
        for c in range(dv):
            do_row[c] = do[h, i, c] if i < Tq else 0
        lse_i = lse[h, i] if i < Tq else 0
        delta_i = delta[h, i] if i < Tq else 0
        k_end = min(Tk, i0 + TILE + offset) if causal else Tk
        for j0 in range(0, k_end, TILE):
            if j0 + t < Tk:
                for c in range(d):
                    k_tile[t, c] = k[h, j0 + t, c]
                for c in range(dv):
                    v_tile[t, c] = v[h, j0 + t, c]
            cuda.syncthreads()
            if i < Tq:
                n = min(TILE, Tk - j0, i + offset + 1 - j0) if causal else min(TILE, Tk - j0)
                for j in range(n):
                    s = dtype(0)
                    for c in range(d):
                        s += q_row[c] * k_tile[j, c]
                    p = math.exp(s * scale - lse_i)
                    dp = dtype(0)
                    for c in range(dv):
                        dp += do_row[c] * v_tile[j, c]
                    ds = p * (dp - delta_i)
                    for c in range(d):
                        dq_row[c] += ds * k_tile[j, c]
            cuda.syncthreads()
        if i < Tq:
            for c in range(d):
                dq[h, i, c] = dq_row[c] * scale

    return forward_kernel, dkdv_kernel, dq_kernel


def _launch(kernel, q, rows, *args):
    """Run `kernel` with one block per (head, tile of `rows`); tensors go in as (B*H, T, ...) views."""
    if q.shape[-1] > D_MAX or args[2].shape[-1] > D_MAX:
        raise ValueError(f"head size up to {D_MAX}")
    grid = (q.shape[0] * q.shape[1], (rows + TILE - 1) // TILE)
    views = [kernel_view(a.flatten(0, 1).contiguous()) if isinstance(a, torch.Tensor) else a for a in (q, *args)]
    if q.is_cuda:
        stream = cuda.external_stream(torch.cuda.current_stream(q.device).cuda_stream)
        kernel[grid, TILE, stream](*views)
    else:
        kernel[grid, TILE](*views)


def _numba_dtype(t):
    return {torch.float32: numba.float32, torch.float64: numba.float64}[t.dtype]


def forward(q, k, v, causal=False, scale=None):
    """(out, lse) for tensors q (B, H, Tq, d), k (B, H, Tk, d), v (B, H, Tk, dv)."""
    assert not causal or q.shape[2] <= k.shape[2], "causal attention needs Tq <= Tk (each query sees key 0)"
    scale = _numba_dtype(q)(q.shape[-1] ** -0.5 if scale is None else scale)   # float32 work stays float32
    out = q.new_empty(*q.shape[:3], v.shape[-1])
    lse = q.new_empty(q.shape[:3])
    forward_kernel, _, _ = kernels(_numba_dtype(q))
    _launch(forward_kernel, q, q.shape[2], k, v, out, lse, scale, causal)
    return out, lse


def backward(q, k, v, do, lse, delta, causal=False, scale=None):
    """(dq, dk, dv) from the inputs, the forward's lse, dO and delta = rowsum(dO * O)."""
    scale = _numba_dtype(q)(q.shape[-1] ** -0.5 if scale is None else scale)   # float32 work stays float32
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _, dkdv_kernel, dq_kernel = kernels(_numba_dtype(q))
    _launch(dkdv_kernel, q, k.shape[2], k, v, do, lse, delta, dk, dv, scale, causal)
    _launch(dq_kernel, q, q.shape[2], k, v, do, lse, delta, dq, scale, causal)
    return dq, dk, dv
