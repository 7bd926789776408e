"""Tiled attention with an online softmax on the CPU, in Numba (FlashAttention-2's algorithm).

    out = softmax(q k^T * scale) v        q: (BH, Tq, d), k: (BH, Tk, d), v: (BH, Tk, dv)

Naive attention builds the Tq x Tk score matrix, softmaxes it and multiplies by v: for T = 4096
and 4 heads that is 4 * 4096^2 float32 = 268 MB, written to memory and read back twice. Here each
task takes a tile of BQ query rows and walks over the keys BK at a time; a BQ x BK tile of scores
lives for one step and is never stored. The whole output row is not known until all keys are seen,
so the softmax is computed *online*, keeping for each query row i:

    m_i = the largest score seen so far,  l_i = sum_j exp(s_ij - m_i),  acc_i = sum_j exp(s_ij - m_i) v_j

(l is `denom` in the code). When a new tile raises the maximum from m to m', every term already
summed was taken relative to the old m: multiplying l and acc by alpha = exp(m - m') re-bases them
on m' (exp(s - m) * alpha = exp(s - m')). After the last tile, out_i = acc_i / l_i. Subtracting the running max keeps every
exponent <= 0, so nothing overflows. The forward also saves lse_i = m_i + log(l_i), the log of the
softmax's denominator: one number per row, all the backward needs to rebuild the probabilities.

The backward needs P = exp(S * scale - lse) again, tile by tile. Storing P would bring back the
Tq x Tk memory; recomputing it costs one more small matmul per tile, and the CPU (like a GPU) has far
more arithmetic to spare than memory traffic. With D_i = rowsum(dO_i * O_i) (= sum_j P_ij dP_ij):

    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - D),   dQ = dS K * scale,   dK = dS^T Q * scale

dK and dV sum over queries, dQ over keys: `dkdv_tile` takes a tile of keys and `dq_tile` a tile of
queries, so no two tasks write the same rows and no locks are needed (at the price of computing P
twice; FlashAttention-2 on a GPU uses atomic adds for dQ instead).

Each `*_kernel` is only a `prange` over (head, tile) tasks, handing each task's views to a serial
`*_tile` function: the tile functions read like the algorithm, and Numba compiles them faster.
The exponentials use `exp_neg` (fastexp.py), which LLVM can vectorize: every exponent here is <= 0.

Causal masking keeps key j for query i when j <= i + (Tk - Tq): the queries are the last Tq of
the Tk positions, as with a KV cache (Tq == Tk is the usual mask). Tiles entirely above the
diagonal are skipped, which halves the work.

The two tile products (scores = Q K^T, acc += P V, and the backward's four) go to BLAS through
np.dot: small matrices that fit in cache, like the tensor-core tiles of a GPU. The work that is ours
is the online softmax between them. OpenBLAS runs a product of M*N*K <= 2^18 on the calling thread,
so the tile sizes keep it there, and BLAS's threads never compete with prange's.
"""

import numba
import numpy as np
from numba import prange

from course_lib.fused.fastexp import exp_neg

BQ = 64   # query rows per tile
FASTMATH = {"reassoc", "contract", "nsz", "arcp"}   # may reorder sums (SIMD); keeps inf and NaN handling


def key_tile(d):
    """Keys per tile: 64 for d <= 64, fewer for bigger heads, so that BQ * BK * d stays <= 2^18."""
    return max(8, min(64, 2**18 // (BQ * d)))


@numba.njit(fastmath=FASTMATH, cache=True)
def forward_tile(q, k, v, out, lse, i0, offset, scale, causal, BK):
    """One tile of queries of one head: q (nq, d) holds query rows i0.., k (Tk, d) and v (Tk, dv) the
    head's keys and values. Writes out (nq, dv) and lse (nq). offset = Tk - Tq, for the causal mask."""
    nq, Tk = q.shape[0], k.shape[0]
    m = np.full(nq, -np.inf, q.dtype)                      # running max of each row
    denom = np.zeros(nq, q.dtype)                          # running sum of exp(s - m)
    acc = np.zeros((nq, v.shape[1]), q.dtype)              # running sum of exp(s - m) v
    k_end = min(Tk, i0 + nq + offset) if causal else Tk    # causal: later keys are hidden from every row
    for j0 in range(0, k_end, BK):
        nk = min(BK, k_end - j0)
        s = np.dot(q, k[j0:j0 + nk].T)                     # (nq, nk) raw scores
        for i in range(nq):
            n = min(nk, i0 + i + offset + 1 - j0) if causal else nk   # the keys row i may see
            m_new = m[i]
            for j in range(n):
                s[i, j] *= scale
                m_new = max(m_new, s[i, j])
            alpha = exp_neg(m[i] - m_new)                  # re-bases the old sums on the new max
            total = denom[i] * alpha
            for j in range(n):
                s[i, j] = exp_neg(s[i, j] - m_new)         # s becomes this tile of P, times denom
                total += s[i, j]
            s[i, max(n, 0):] = 0.0                         # masked keys add nothing to acc
            acc[i] *= alpha
            m[i], denom[i] = m_new, total
        acc += np.dot(s, v[j0:j0 + nk])
    for i in range(nq):
        out[i] = acc[i] / denom[i]
        lse[i] = m[i] + np.log(denom[i])


@numba.njit(parallel=True, cache=True)
def forward_kernel(q, k, v, out, lse, scale, causal, BK):
    """out = softmax(q k^T * scale) v, and lse, for q (BH, Tq, d): one (head, query tile) per task."""
    BH, Tq, _ = q.shape
    n_tiles = (Tq + BQ - 1) // BQ
    for task in prange(BH * n_tiles):
        h, i0 = task // n_tiles, (task % n_tiles) * BQ
        rows = slice(i0, i0 + BQ)
        forward_tile(q[h, rows], k[h], v[h], out[h, rows], lse[h, rows], i0, k.shape[1] - Tq, scale, causal, BK)


@numba.njit(fastmath=FASTMATH, cache=True)
def probabilities(q, k, lse, i0, j0, offset, scale, causal):
    """The tile P[i0:, j0:] = exp(q k^T * scale - lse), recomputed; 0 where the mask hides a key."""
    p = np.dot(q, k.T)
    for i in range(p.shape[0]):
        n = min(p.shape[1], i0 + i + offset + 1 - j0) if causal else p.shape[1]
        for j in range(n):
            p[i, j] = exp_neg(p[i, j] * scale - lse[i])
        p[i, max(n, 0):] = 0.0
    return p


@numba.njit(fastmath=FASTMATH, cache=True)
def score_grads(p, do, v, delta):
    """dS = P * (dP - D) for one tile, with dP = dO V^T: the gradient of the scores (before scale)."""
    ds = np.dot(do, v.T)
    for i in range(ds.shape[0]):
        for j in range(ds.shape[1]):
            ds[i, j] = p[i, j] * (ds[i, j] - delta[i])
    return ds


@numba.njit(fastmath=FASTMATH, cache=True)
def dkdv_tile(q, k, v, do, lse, delta, dk, dv, j0, offset, scale, causal):
    """dK and dV for one tile of keys (k, v: rows j0..) of one head, over the query tiles that see them."""
    dk_acc, dv_acc = np.zeros(k.shape, q.dtype), np.zeros(v.shape, q.dtype)
    first = max(0, j0 - offset) // BQ * BQ if causal else 0    # earlier queries see none of these keys
    for i0 in range(first, q.shape[0], BQ):
        q_t, do_t = q[i0:i0 + BQ], do[i0:i0 + BQ]
        p = probabilities(q_t, k, lse[i0:i0 + BQ], i0, j0, offset, scale, causal)
        dv_acc += np.dot(p.T, do_t)
        ds = score_grads(p, do_t, v, delta[i0:i0 + BQ])
        dk_acc += np.dot(ds.T, q_t)
    dk[:] = dk_acc * scale
    dv[:] = dv_acc


@numba.njit(fastmath=FASTMATH, cache=True)
def dq_tile(q, k, v, do, lse, delta, dq, i0, offset, scale, causal, BK):
    """dQ for one tile of queries (q, do, lse, delta: rows i0..) of one head, over the key tiles they see."""
    dq_acc = np.zeros(q.shape, q.dtype)
    k_end = min(k.shape[0], i0 + q.shape[0] + offset) if causal else k.shape[0]
    for j0 in range(0, k_end, BK):
        k_t = k[j0:j0 + BK]
        p = probabilities(q, k_t, lse, i0, j0, offset, scale, causal)
        ds = score_grads(p, do, v[j0:j0 + BK], delta)
        dq_acc += np.dot(ds, k_t)
    dq[:] = dq_acc * scale


@numba.njit(parallel=True, cache=True)
def backward_kernel(q, k, v, do, lse, delta, dq, dk, dv, scale, causal, BK):
    """dQ, dK, dV: first one (head, key tile) per task for dK and dV, then one (head, query tile) for dQ."""
    BH, Tq, _ = q.shape
    Tk = k.shape[1]
    n_tiles = (Tk + BK - 1) // BK
    for task in prange(BH * n_tiles):
        h, j0 = task // n_tiles, (task % n_tiles) * BK
        keys = slice(j0, j0 + BK)
        dkdv_tile(q[h], k[h, keys], v[h, keys], do[h], lse[h], delta[h], dk[h, keys], dv[h, keys],
                  j0, Tk - Tq, scale, causal)
    n_tiles = (Tq + BQ - 1) // BQ
    for task in prange(BH * n_tiles):
        h, i0 = task // n_tiles, (task % n_tiles) * BQ
        rows = slice(i0, i0 + BQ)
        dq_tile(q[h, rows], k[h], v[h], do[h, rows], lse[h, rows], delta[h, rows], dq[h, rows],
                i0, Tk - Tq, scale, causal, BK)


def _check(q, k, v, causal):
    assert q.ndim == k.ndim == v.ndim == 3 and q.shape[2] == k.shape[2] and k.shape[1] == v.shape[1], "bad shapes"
    assert q.dtype == k.dtype == v.dtype, "q, k, v must share one dtype"
    assert not causal or q.shape[1] <= k.shape[1], "causal attention needs Tq <= Tk (each query sees key 0)"


def forward(q, k, v, causal=False, scale=None):
    """(out, lse) for C-contiguous numpy arrays q (BH, Tq, d), k (BH, Tk, d), v (BH, Tk, dv)."""
    _check(q, k, v, causal)
    scale = q.dtype.type(q.shape[2] ** -0.5 if scale is None else scale)   # float32 work stays float32
    out = np.empty(q.shape[:2] + v.shape[2:], q.dtype)
    lse = np.empty(q.shape[:2], q.dtype)
    forward_kernel(q, k, v, out, lse, scale, causal, key_tile(max(q.shape[2], v.shape[2])))
    return out, lse


def backward(q, k, v, do, lse, delta, causal=False, scale=None):
    """(dq, dk, dv) from the inputs, the forward's lse, dO and delta = rowsum(dO * O) (BH, Tq)."""
    _check(q, k, v, causal)
    scale = q.dtype.type(q.shape[2] ** -0.5 if scale is None else scale)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    backward_kernel(q, k, v, do, lse, delta, dq, dk, dv, scale, causal, key_tile(max(q.shape[2], v.shape[2])))
    return dq, dk, dv
