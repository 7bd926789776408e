"""FlashAttention-2's forward and backward on the CPU, in Numba: no T x T matrix, ever.

This file holds the course's answers to exercises 10.3 (`flash_forward`: `forward_kernel` and its
`forward_tile`) and 10.4 (`flash_backward`: `backward_kernel` and its `backward_key_tile`). Read it once
your checks pass.

    out = softmax(q k^T * scale) v        q: (BH, Tq, d), k: (BH, Tk, d), v: (BH, Tk, dv)

Naive attention builds the Tq x Tk scores, softmaxes them and multiplies by v: at T = 4096 with 4
heads that is 4 * 4096^2 float32 = 268 MB, written and read back twice. Here a task takes a tile of
BQ query rows and walks the keys BK at a time; a BQ x BK tile of scores lives for one step and is
never stored. No row knows its softmax's denominator until it has seen every key, so the softmax
is computed *online*, keeping for each query row i

    m_i = the largest score seen so far,  l_i = sum_j exp(s_ij - m_i),  acc_i = sum_j exp(s_ij - m_i) v_j.

When a tile raises the max from m to m', the old sums were taken relative to m: multiplying l and
acc by alpha = exp(m - m') moves them to m'. After the last tile, out_i = acc_i / l_i. Every
exponent is <= 0, so nothing overflows, and `exp_neg` (simd/fastexp.py) vectorizes. The forward also
writes lse_i = m_i + log(l_i), one number per row: all the backward needs to rebuild the softmax.
What a forward task allocates is the size of its tiles, whatever Tk is: nothing grows with the keys.

The backward recomputes each tile of P = exp(s * scale - lse) instead of storing P (which would
bring back the Tq x Tk memory). With D_i = rowsum(dO_i * O_i) (which equals sum_j P_ij dP_ij):

    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - D),   dQ = dS K * scale,   dK = dS^T Q * scale.

dK and dV of a key tile sum over the query tiles, dQ of a query tile over the key tiles. A task owns
a group of key tiles of one head: it keeps their dK and dV in small buffers while it walks the
query tiles that see them, and adds its share of dQ into its own copy of the head's dQ (one copy per
group, summed at the end: no two tasks ever write the same number, so no locks). With as many heads
as cores there is one group per head and one copy.

Causal masking keeps key j for query i when j <= i + (Tk - Tq): the queries are the last Tq of the Tk
positions, as with a KV cache (Tq == Tk is the usual mask). Tiles entirely above the diagonal are
never visited, which halves the work; on the diagonal, each row stops at its last visible key.

The forward keeps its scores transposed: a key per row, a query per column (st = S^T, BK x BQ). Its two
products go through `tiles.matmul` (out = a @ b, vectorized along a row of out: no lane sums, see
simd/tiles.py): S^T = K Q^T, from the tile's queries transposed once per task (qt, d x BQ), and
acc += P V, read as (P^T)^T V. Neither K nor V is copied, and every step of the online softmax runs
along a row of st, across the queries, as elementwise vector work: the running maxes (one max per
query per key), the exponentials and the sums. Laid out a query per row, each row's max would be a
reduction along the row, which LLVM leaves scalar. The backward's products go through `tiles.matmul_bt`
(out = a @ b.T, all rows contiguous); it reads K^T, Q^T and dO^T from copies made once per call, tile
by tile (O(T d) memory, like its dQ copies). The tasks run in a zigzag order of tiles
(0, n-1, 1, n-2, ...): causal tiles far down the diagonal hold more work, and any contiguous half of
the tasks, which is what each of two cores gets, holds half the work.

Tiles. The forward's tiles are 64 queries by 256 keys. Each key tile rescales acc (BQ x dv) once, so
long key tiles rescale it less often; st is then 64 KB, which stays in L2, and 128 keys (32 KB, L1)
ran as fast. The zigzag order balances the causal triangle over the cores (benchmarks/ch10_profile.py
prints the balance).
"""

import numba
import numpy as np
from numba import prange

from course_lib.simd.fastexp import exp_neg
from course_lib.simd.tiles import FASTMATH, matmul, matmul_bt, transpose

FORWARD_TILES = (64, 256)    # (BQ, BK): query rows and keys per tile of the forward
BACKWARD_TILES = (64, 64)    # and of the backward


@numba.njit(inline="always")
def zigzag(t, n):
    """The t-th tile to run of n: 0, n-1, 1, n-2, ... so that any contiguous half holds half the work."""
    return t // 2 if t % 2 == 0 else n - 1 - t // 2


@numba.njit(parallel=True, cache=True)
def tiles_transposed(x, B):
    """x (H, T, c) -> (H, ceil(T / B), c, B): each tile of B rows transposed, zero past the end."""
    H, T, c = x.shape
    n = (T + B - 1) // B
    out = np.zeros((H, n, c, B), x.dtype)
    for task in prange(H * n):
        h, t = task // n, task % n
        transpose(x[h, t * B:], out[h, t], min(B, T - t * B), c)
    return out


@numba.njit(fastmath=FASTMATH, cache=True)
def forward_tile(q, k, v, out, lse, i0, nq, offset, scale, causal, BK):
    """The course's answer to exercise 10.3 (`flash_forward`): read it once your check passes.

    One tile of queries of one head: rows i0 .. i0 + nq of q (Tq, d) against k (Tk, d) and v (Tk, dv).
    Writes those rows of out (Tq, dv) and lse (Tq). Every buffer is the size of a tile, and holds a query
    per column: row j of st is key j's score for every query of the tile."""
    Tk, d, dv = k.shape[0], q.shape[1], v.shape[1]
    qt = np.empty((d, nq), q.dtype)                        # the tile's queries, times scale, transposed
    st = np.empty((BK, nq), q.dtype)                       # S^T of one key tile, then P^T
    acc = np.zeros((nq, dv), q.dtype)                      # running sum of exp(s - m) v
    m = np.full(nq, -np.inf, q.dtype)                      # running max of each query's scores
    m_new = np.empty(nq, q.dtype)
    denom = np.zeros(nq, q.dtype)                          # running sum of exp(s - m)
    for i in range(nq):
        for c in range(d):
            qt[c, i] = q[i0 + i, c] * scale
    k_end = min(Tk, i0 + nq + offset) if causal else Tk    # causal: later keys are hidden from every row
    for j0 in range(0, k_end, BK):
        nk = min(BK, k_end - j0)
        matmul(k[j0:], qt, st, nk, nq, d, False)           # S^T = K Q^T (scaled), (nk, nq)
        m_new[:] = m
        for j in range(nk):                                # the maxes, key after key, for all queries at once
            lo = _first_seeing(j0 + j, i0, nq, offset, causal)
            row, m_row = st[j, lo:nq], m_new[lo:nq]        # views from lo: the loops below start at 0
            for i in range(nq - lo):
                m_row[i] = max(m_row[i], row[i])
        for i in range(nq):
            alpha = exp_neg(m[i] - m_new[i])               # moves the old sums to the new max
            m[i], denom[i] = m_new[i], denom[i] * alpha
            for c in range(dv):
                acc[i, c] *= alpha
        for j in range(nk):
            lo = _first_seeing(j0 + j, i0, nq, offset, causal)
            st[j, :lo] = 0                                 # queries before lo do not see key j: it adds nothing
            row, m_row, d_row = st[j, lo:nq], m[lo:nq], denom[lo:nq]
            for i in range(nq - lo):
                p = exp_neg(row[i] - m_row[i])
                row[i] = p
                d_row[i] += p
        matmul(st, v[j0:], acc, nq, dv, nk, True, True)    # acc += P V = (P^T)^T V: no copy of V, none of P
    for i in range(nq):
        for c in range(dv):
            out[i0 + i, c] = acc[i, c] / denom[i]
        lse[i0 + i] = m[i] + np.log(denom[i])


@numba.njit(inline="always")
def _first_seeing(j, i0, nq, offset, causal):
    """The first query of the tile (0 .. nq) that sees key j: query i0 + i sees it when j <= i0 + i + offset."""
    return min(nq, max(0, j - i0 - offset)) if causal else 0


@numba.njit(parallel=True, cache=True)
def forward_kernel(q, k, v, out, lse, scale, causal, BQ, BK):
    """The course's answer to exercise 10.3 (`flash_forward`): read it once your check passes.

    out = softmax(q k^T * scale) v and lse, written in place; one task per (head, query tile).
    q (BH, Tq, d), k (BH, Tk, d), v (BH, Tk, dv), out (BH, Tq, dv), lse (BH, Tq), all C-contiguous."""
    BH, Tq, _ = q.shape
    n = (Tq + BQ - 1) // BQ
    for task in prange(BH * n):
        h, i0 = task // n, zigzag(task % n, n) * BQ
        forward_tile(q[h], k[h], v[h], out[h], lse[h], i0, min(BQ, Tq - i0), k.shape[1] - Tq, scale, causal, BK)


@numba.njit(fastmath=FASTMATH, cache=True)
def backward_key_tile(q, k, v, do, lse, delta, qt, dot, kt, dq, dk, dv, j0, offset, scale, causal, BQ):
    """The course's answer to exercise 10.4 (`flash_backward`): read it once your check passes.

    dK and dV of one key tile (rows j0 .. j0 + nk of k and v) of one head, and its share of dQ, added
    into dq (Tq, d). qt, dot: Q^T and dO^T by query tile (n, d, BQ); kt: this key tile's K^T (d, BK)."""
    Tq, d = q.shape
    dvs = v.shape[1]
    nk = min(kt.shape[1], k.shape[0] - j0)
    p, ds = np.empty((BQ, nk), q.dtype), np.empty((BQ, nk), q.dtype)      # P and dS of one tile
    pt, dst = np.empty((nk, BQ), q.dtype), np.empty((nk, BQ), q.dtype)    # and their transposes
    dk_acc, dv_acc = np.zeros((nk, d), q.dtype), np.zeros((nk, dvs), q.dtype)
    first = max(0, j0 - offset) // BQ * BQ if causal else 0    # earlier queries see none of these keys
    for i0 in range(first, Tq, BQ):
        nq = min(BQ, Tq - i0)
        matmul_bt(q[i0:], k[j0:], p, nq, nk, d, False)           # S, unscaled
        matmul_bt(do[i0:], v[j0:], ds, nq, nk, dvs, False)       # dP = dO V^T
        for i in range(nq):
            n = max(0, min(nk, i0 + i + offset + 1 - j0)) if causal else nk   # the keys row i sees
            for j in range(n):
                p[i, j] = exp_neg(p[i, j] * scale - lse[i0 + i])   # P recomputed from the saved lse
                ds[i, j] = p[i, j] * (ds[i, j] - delta[i0 + i])     # dS = P * (dP - D)
            for j in range(n, nk):
                p[i, j] = ds[i, j] = 0
        transpose(p, pt, nq, nk)
        transpose(ds, dst, nq, nk)
        t = i0 // BQ
        matmul_bt(pt, dot[t], dv_acc, nk, dvs, nq, True)         # dV += P^T dO
        matmul_bt(dst, qt[t], dk_acc, nk, d, nq, True)           # dK += dS^T Q
        matmul_bt(ds, kt, dq[i0:], nq, d, nk, True)              # dQ += dS K
    for j in range(nk):
        for c in range(d):
            dk[j0 + j, c] = dk_acc[j, c] * scale
        for c in range(dvs):
            dv[j0 + j, c] = dv_acc[j, c]


def backward_kernel(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK):
    """The course's answer to exercise 10.4 (`flash_backward`): read it once your check passes.

    dq, dk, dv of attention, written in place, from the inputs, the output o, its gradient do and
    the forward's lse. Shapes as in forward_kernel; dq, dk, dv like q, k, v. Splits each head's key
    tiles into enough groups to give every core a task."""
    groups = max(1, -(-numba.get_num_threads() // q.shape[0]))
    backward_groups(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK, groups)


@numba.njit(parallel=True, cache=True)
def backward_groups(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK, groups):
    """backward_kernel's work: one task per (head, group of key tiles)."""
    BH, Tq, d = q.shape
    Tk = k.shape[1]
    delta = np.empty((BH, Tq), q.dtype)                # D_i = rowsum(dO_i * O_i)
    for r in prange(BH * Tq):
        h, i = r // Tq, r % Tq
        total = q.dtype.type(0)
        for c in range(o.shape[2]):
            total += do[h, i, c] * o[h, i, c]
        delta[h, i] = total
    qt, dot, kt = tiles_transposed(q, BQ), tiles_transposed(do, BQ), tiles_transposed(k, BK)
    n = (Tk + BK - 1) // BK
    groups = min(n, groups)
    dq_parts = np.zeros((groups, BH, Tq, d), q.dtype)
    for task in prange(BH * groups):
        h, g = task // groups, task % groups
        for t in range(g, n, groups):
            j0 = zigzag(t, n) * BK
            backward_key_tile(q[h], k[h], v[h], do[h], lse[h], delta[h], qt[h], dot[h], kt[h, j0 // BK],
                              dq_parts[g, h], dk[h], dv[h], j0, Tk - Tq, scale, causal, BQ)
    for r in prange(BH * Tq):
        h, i = r // Tq, r % Tq
        for c in range(d):
            total = q.dtype.type(0)
            for g in range(groups):
                total += dq_parts[g, h, i, c]
            dq[h, i, c] = total * scale


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
    forward_kernel(q, k, v, out, lse, scale, causal, *FORWARD_TILES)
    return out, lse


def backward(q, k, v, o, do, lse, causal=False, scale=None):
    """(dq, dk, dv) from the inputs, the forward's output o and lse, and do, the gradient of o."""
    _check(q, k, v, causal)
    scale = q.dtype.type(q.shape[2] ** -0.5 if scale is None else scale)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    backward_kernel(q, k, v, o, do, lse, dq, dk, dv, scale, causal, *BACKWARD_TILES)
    return dq, dk, dv
