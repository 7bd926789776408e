"""Chapter 10: fresh answers (scratch for the audit)."""

import math

import numba
import numpy as np
import pytest
import torch
from numba import prange

from course_lib.checks import CheckFailed
from course_lib.checks import ch10 as check
from course_lib.simd.tiles import matmul_bt, transpose

FM = {"reassoc", "contract", "nsz", "arcp"}


@pytest.fixture(autouse=True)
def _isolated(workspace):
    """A passing check saves the answer: keep it in a temporary workspace."""


# ---------------------------------------------------------------- 1. online softmax update

def online_update_rows(m, l, acc, scores, values):
    """Correct, written row by row in plain Python: the running max, then one rebasing factor per row."""
    n = scores.shape[0]
    m2, l2, acc2 = np.empty(n), np.empty(n), np.empty((n, values.shape[1]))
    for r in range(n):
        new_max = max(m[r], float(np.max(scores[r])))
        keep = 0.0 if m[r] == -math.inf else math.exp(m[r] - new_max)
        w = np.exp(scores[r] - new_max)
        m2[r] = new_max
        l2[r] = l[r] * keep + w.sum()
        acc2[r] = acc[r] * keep + w @ values
    return m2, l2, acc2


def online_no_rescale(m, l, acc, scores, values):          # wrong: the old sums stay on the old max
    m2 = np.maximum(m, scores.max(axis=1))
    w = np.exp(scores - m2[:, None])
    return m2, l + w.sum(axis=1), acc + w @ values


def online_rescale_l_only(m, l, acc, scores, values):      # wrong: rescales l, forgets acc
    m2 = np.maximum(m, scores.max(axis=1))
    f = np.exp(m - m2)
    w = np.exp(scores - m2[:, None])
    return m2, f * l + w.sum(axis=1), acc + w @ values


def online_exp_then_shift(m, l, acc, scores, values):      # right on small scores; exp(scores) overflows in the hundreds
    m2 = np.maximum(m, scores.max(axis=1))
    f = np.exp(m - m2)
    w = np.exp(scores) * np.exp(-m2)[:, None]
    return m2, f * l + w.sum(axis=1), f[:, None] * acc + w @ values


# ---------------------------------------------------------------- 2. fused scan

@numba.njit(parallel=True, fastmath=FM, cache=True)
def scan_channels_outer(x, delta, A, B, C, D, y, h_last, ckpt, chunk):
    """Correct, another layout: prange over channels, the batch inside; math.exp; a chunk counter."""
    nb, L, Dm = x.shape
    N = A.shape[1]
    for d in prange(Dm):
        state = np.empty(N, x.dtype)
        for b in range(nb):
            for n in range(N):
                state[n] = 0
            c, left = 0, 0
            for t in range(L):
                if left == 0:
                    ckpt[b, c, d, :] = state
                    c += 1
                    left = chunk
                left -= 1
                dt = delta[b, t, d]
                xt = x[b, t, d]
                total = D[d] * xt
                for n in range(N):
                    state[n] = math.exp(dt * A[d, n]) * state[n] + dt * xt * B[b, t, n]
                    total += state[n] * C[b, t, n]
                y[b, t, d] = total
            h_last[b, d, :] = state


@numba.njit(parallel=True, fastmath=FM, cache=True)
def scan_keeps_history(x, delta, A, B, C, D, y, h_last, ckpt, chunk):
    """Right numbers; every state of the sequence kept (L x N per task): memory grows with L."""
    nb, L, Dm = x.shape
    N = A.shape[1]
    for pair in prange(nb * Dm):
        b, d = pair // Dm, pair % Dm
        hist = np.zeros((L + 1, N), x.dtype)
        for t in range(L):
            for n in range(N):
                hist[t + 1, n] = math.exp(delta[b, t, d] * A[d, n]) * hist[t, n] + delta[b, t, d] * x[b, t, d] * B[b, t, n]
        for t in range(L):
            s = D[d] * x[b, t, d]
            for n in range(N):
                s += C[b, t, n] * hist[t + 1, n]
            y[b, t, d] = s
            if t % chunk == 0:
                ckpt[b, t // chunk, d, :] = hist[t]
        h_last[b, d, :] = hist[L]


@numba.njit(parallel=True, fastmath=FM, cache=True)
def scan_serial(x, delta, A, B, C, D, y, h_last, ckpt, chunk):
    """Right numbers, flat memory, but a serial range under parallel=True."""
    nb, L, Dm = x.shape
    N = A.shape[1]
    for pair in range(nb * Dm):
        b, d = pair // Dm, pair % Dm
        h = np.zeros(N, x.dtype)
        for t in range(L):
            if t % chunk == 0:
                ckpt[b, t // chunk, d, :] = h
            s = D[d] * x[b, t, d]
            for n in range(N):
                h[n] = math.exp(delta[b, t, d] * A[d, n]) * h[n] + delta[b, t, d] * x[b, t, d] * B[b, t, n]
                s += C[b, t, n] * h[n]
            y[b, t, d] = s
        h_last[b, d, :] = h


@numba.njit(parallel=True, fastmath=FM, cache=True)
def scan_ckpt_after_step(x, delta, A, B, C, D, y, h_last, ckpt, chunk):
    """Wrong: the checkpoint holds the state after the chunk's first step."""
    nb, L, Dm = x.shape
    N = A.shape[1]
    for pair in prange(nb * Dm):
        b, d = pair // Dm, pair % Dm
        h = np.zeros(N, x.dtype)
        for t in range(L):
            s = D[d] * x[b, t, d]
            for n in range(N):
                h[n] = math.exp(delta[b, t, d] * A[d, n]) * h[n] + delta[b, t, d] * x[b, t, d] * B[b, t, n]
                s += C[b, t, n] * h[n]
            y[b, t, d] = s
            if t % chunk == 0:
                ckpt[b, t // chunk, d, :] = h
        h_last[b, d, :] = h


@numba.njit(parallel=True, fastmath=FM, cache=True)
def scan_float64_state(x, delta, A, B, C, D, y, h_last, ckpt, chunk):
    """The exercise asks the state in x's dtype; this one keeps it in float64 always."""
    nb, L, Dm = x.shape
    N = A.shape[1]
    for pair in prange(nb * Dm):
        b, d = pair // Dm, pair % Dm
        h = np.zeros(N, np.float64)
        for t in range(L):
            if t % chunk == 0:
                for n in range(N):
                    ckpt[b, t // chunk, d, n] = h[n]
            s = D[d] * x[b, t, d]
            for n in range(N):
                h[n] = math.exp(delta[b, t, d] * A[d, n]) * h[n] + delta[b, t, d] * x[b, t, d] * B[b, t, n]
                s += C[b, t, n] * h[n]
            y[b, t, d] = s
        for n in range(N):
            h_last[b, d, n] = h[n]


# ---------------------------------------------------------------- 3. flash forward

@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_rowwise_online(q, k, v, out, lse, scale, causal, BQ, BK):
    """Correct, written differently: tile-major task order, explicit loops (no tile products), each row folds
    one key tile at a time with its own running max, sum and accumulator."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    shift = Tk - Tq
    n_qt = (Tq + BQ - 1) // BQ
    for job in prange(BH * n_qt):
        qt, h = job // BH, job % BH
        lo = qt * BQ
        hi = min(Tq, lo + BQ)
        rows = hi - lo
        run_max = np.empty(rows, q.dtype)
        run_sum = np.empty(rows, q.dtype)
        acc = np.empty((rows, dv), q.dtype)
        s = np.empty(BK, q.dtype)
        for r in range(rows):
            run_max[r] = -np.inf
            run_sum[r] = 0
            for c in range(dv):
                acc[r, c] = 0
        kend = min(Tk, hi + shift) if causal else Tk
        for j0 in range(0, kend, BK):
            j1 = min(kend, j0 + BK)
            for r in range(rows):
                lim = min(j1, lo + r + shift + 1) if causal else j1
                if lim <= j0:
                    continue
                top = run_max[r]
                for j in range(j0, lim):
                    t = q.dtype.type(0)
                    for c in range(d):
                        t += q[h, lo + r, c] * k[h, j, c]
                    s[j - j0] = t * scale
                    if s[j - j0] > top:
                        top = s[j - j0]
                f = math.exp(run_max[r] - top)
                run_sum[r] *= f
                for c in range(dv):
                    acc[r, c] *= f
                for j in range(j0, lim):
                    w = math.exp(s[j - j0] - top)
                    run_sum[r] += w
                    for c in range(dv):
                        acc[r, c] += w * v[h, j, c]
                run_max[r] = top
        for r in range(rows):
            for c in range(dv):
                out[h, lo + r, c] = acc[r, c] / run_sum[r]
            lse[h, lo + r] = run_max[r] + math.log(run_sum[r])


@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_serial(q, k, v, out, lse, scale, causal, BQ, BK):
    """Right numbers, flat memory, tiles skipped; but a serial range under parallel=True."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    shift = Tk - Tq
    n_qt = (Tq + BQ - 1) // BQ
    for job in range(BH * n_qt):
        qt, h = job // BH, job % BH
        lo = qt * BQ
        hi = min(Tq, lo + BQ)
        rows = hi - lo
        run_max = np.empty(rows, q.dtype)
        run_sum = np.empty(rows, q.dtype)
        acc = np.empty((rows, dv), q.dtype)
        s = np.empty(BK, q.dtype)
        for r in range(rows):
            run_max[r] = -np.inf
            run_sum[r] = 0
            for c in range(dv):
                acc[r, c] = 0
        kend = min(Tk, hi + shift) if causal else Tk
        for j0 in range(0, kend, BK):
            j1 = min(kend, j0 + BK)
            for r in range(rows):
                lim = min(j1, lo + r + shift + 1) if causal else j1
                if lim <= j0:
                    continue
                top = run_max[r]
                for j in range(j0, lim):
                    t = q.dtype.type(0)
                    for c in range(d):
                        t += q[h, lo + r, c] * k[h, j, c]
                    s[j - j0] = t * scale
                    if s[j - j0] > top:
                        top = s[j - j0]
                f = math.exp(run_max[r] - top)
                run_sum[r] *= f
                for c in range(dv):
                    acc[r, c] *= f
                for j in range(j0, lim):
                    w = math.exp(s[j - j0] - top)
                    run_sum[r] += w
                    for c in range(dv):
                        acc[r, c] += w * v[h, j, c]
                run_max[r] = top
        for r in range(rows):
            for c in range(dv):
                out[h, lo + r, c] = acc[r, c] / run_sum[r]
            lse[h, lo + r] = run_max[r] + math.log(run_sum[r])


@numba.njit(fastmath=FM, cache=True)
def _one_query_tile(q, k, v, out, lse, scale, causal, BQ, BK, h, lo):
    Tq, d = q.shape[1], q.shape[2]
    Tk, dv = k.shape[1], v.shape[2]
    shift = Tk - Tq
    hi = min(Tq, lo + BQ)
    rows = hi - lo
    run_max = np.full(rows, -np.inf, q.dtype)
    run_sum = np.zeros(rows, q.dtype)
    acc = np.zeros((rows, dv), q.dtype)
    s = np.empty(BK, q.dtype)
    kend = min(Tk, hi + shift) if causal else Tk
    for j0 in range(0, kend, BK):
        j1 = min(kend, j0 + BK)
        for r in range(rows):
            lim = min(j1, lo + r + shift + 1) if causal else j1
            if lim <= j0:
                continue
            top = run_max[r]
            for j in range(j0, lim):
                t = q.dtype.type(0)
                for c in range(d):
                    t += q[h, lo + r, c] * k[h, j, c]
                s[j - j0] = t * scale
                top = max(top, s[j - j0])
            f = math.exp(run_max[r] - top)
            run_sum[r] *= f
            for c in range(dv):
                acc[r, c] *= f
            for j in range(j0, lim):
                w = math.exp(s[j - j0] - top)
                run_sum[r] += w
                for c in range(dv):
                    acc[r, c] += w * v[h, j, c]
            run_max[r] = top
    for r in range(rows):
        for c in range(dv):
            out[h, lo + r, c] = acc[r, c] / run_sum[r]
        lse[h, lo + r] = run_max[r] + math.log(run_sum[r])


@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_heads_parallel(q, k, v, out, lse, scale, causal, BQ, BK):
    """Right numbers; prange over the heads only, a head's query tiles one after another."""
    BH, Tq = q.shape[0], q.shape[1]
    for h in prange(BH):
        for lo in range(0, Tq, BQ):
            _one_query_tile(q, k, v, out, lse, scale, causal, BQ, BK, h, lo)


@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_whole_row(q, k, v, out, lse, scale, causal, BQ, BK):
    """Right numbers, no online softmax: each row's Tk scores in a buffer, then one plain softmax."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    shift = Tk - Tq
    n_qt = (Tq + BQ - 1) // BQ
    for job in prange(BH * n_qt):
        h, lo = job // n_qt, job % n_qt * BQ
        s = np.empty(Tk, q.dtype)
        for i in range(lo, min(Tq, lo + BQ)):
            last = min(Tk, i + shift + 1) if causal else Tk
            top = -np.inf
            for j in range(last):
                t = q.dtype.type(0)
                for c in range(d):
                    t += q[h, i, c] * k[h, j, c]
                s[j] = t * scale
                top = max(top, s[j])
            total = q.dtype.type(0)
            for j in range(last):
                s[j] = math.exp(s[j] - top)
                total += s[j]
            for c in range(dv):
                a = q.dtype.type(0)
                for j in range(last):
                    a += s[j] * v[h, j, c]
                out[h, i, c] = a / total
            lse[h, i] = top + math.log(total)


@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_two_pass(q, k, v, out, lse, scale, causal, BQ, BK):
    """No online softmax, flat memory: one pass for the max and the sum, a second (scores recomputed) for P V."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    shift = Tk - Tq
    for job in prange(BH * Tq):
        h, i = job // Tq, job % Tq
        last = min(Tk, i + shift + 1) if causal else Tk
        top = -np.inf
        for j in range(last):
            t = q.dtype.type(0)
            for c in range(d):
                t += q[h, i, c] * k[h, j, c]
            top = max(top, t * scale)
        total = q.dtype.type(0)
        acc = np.zeros(dv, q.dtype)
        for j in range(last):
            t = q.dtype.type(0)
            for c in range(d):
                t += q[h, i, c] * k[h, j, c]
            w = math.exp(t * scale - top)
            total += w
            for c in range(dv):
                acc[c] += w * v[h, j, c]
        for c in range(dv):
            out[h, i, c] = acc[c] / total
        lse[h, i] = top + math.log(total)


@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_max_from_zero(q, k, v, out, lse, scale, causal, BQ, BK):
    """Wrong: the running max starts at 0."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    shift = Tk - Tq
    n_qt = (Tq + BQ - 1) // BQ
    for job in prange(BH * n_qt):
        qt, h = job // BH, job % BH
        lo = qt * BQ
        hi = min(Tq, lo + BQ)
        rows = hi - lo
        run_max = np.zeros(rows, q.dtype)
        run_sum = np.zeros(rows, q.dtype)
        acc = np.zeros((rows, dv), q.dtype)
        s = np.empty(BK, q.dtype)
        kend = min(Tk, hi + shift) if causal else Tk
        for j0 in range(0, kend, BK):
            j1 = min(kend, j0 + BK)
            for r in range(rows):
                lim = min(j1, lo + r + shift + 1) if causal else j1
                if lim <= j0:
                    continue
                top = run_max[r]
                for j in range(j0, lim):
                    t = q.dtype.type(0)
                    for c in range(d):
                        t += q[h, lo + r, c] * k[h, j, c]
                    s[j - j0] = t * scale
                    top = max(top, s[j - j0])
                f = math.exp(run_max[r] - top)
                run_sum[r] *= f
                for c in range(dv):
                    acc[r, c] *= f
                for j in range(j0, lim):
                    w = math.exp(s[j - j0] - top)
                    run_sum[r] += w
                    for c in range(dv):
                        acc[r, c] += w * v[h, j, c]
                run_max[r] = top
        for r in range(rows):
            for c in range(dv):
                out[h, lo + r, c] = acc[r, c] / run_sum[r]
            lse[h, lo + r] = run_max[r] + math.log(run_sum[r])


@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_all_tiles_weight_zero(q, k, v, out, lse, scale, causal, BQ, BK):
    """Right numbers; every key tile visited, a hidden key weighs 0 (set by assignment) in the whole-tile loops."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    shift = Tk - Tq
    n_qt = (Tq + BQ - 1) // BQ
    for job in prange(BH * n_qt):
        qt, h = job // BH, job % BH
        lo = qt * BQ
        hi = min(Tq, lo + BQ)
        rows = hi - lo
        run_max = np.full(rows, -np.inf, q.dtype)
        run_sum = np.zeros(rows, q.dtype)
        acc = np.zeros((rows, dv), q.dtype)
        s = np.empty(BK, q.dtype)
        for j0 in range(0, Tk, BK):
            j1 = min(Tk, j0 + BK)
            for r in range(rows):
                lim = min(j1, lo + r + shift + 1) if causal else j1
                top = run_max[r]
                for j in range(j0, j1):
                    t = q.dtype.type(0)
                    for c in range(d):
                        t += q[h, lo + r, c] * k[h, j, c]
                    s[j - j0] = t * scale
                    if j < lim:
                        top = max(top, s[j - j0])
                if top == -np.inf:
                    continue
                f = math.exp(run_max[r] - top)
                run_sum[r] *= f
                for c in range(dv):
                    acc[r, c] *= f
                for j in range(j0, j1):
                    w = math.exp(s[j - j0] - top) if j < lim else 0.0
                    run_sum[r] += w
                    for c in range(dv):
                        acc[r, c] += w * v[h, j, c]
                run_max[r] = top
        for r in range(rows):
            for c in range(dv):
                out[h, lo + r, c] = acc[r, c] / run_sum[r]
            lse[h, lo + r] = run_max[r] + math.log(run_sum[r])


@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_all_tiles_scores_only(q, k, v, out, lse, scale, causal, BQ, BK):
    """Right numbers; every key tile's scores computed (hidden keys read), only the visible ones used."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    shift = Tk - Tq
    n_qt = (Tq + BQ - 1) // BQ
    for job in prange(BH * n_qt):
        qt, h = job // BH, job % BH
        lo = qt * BQ
        hi = min(Tq, lo + BQ)
        rows = hi - lo
        run_max = np.full(rows, -np.inf, q.dtype)
        run_sum = np.zeros(rows, q.dtype)
        acc = np.zeros((rows, dv), q.dtype)
        s = np.empty(BK, q.dtype)
        for j0 in range(0, Tk, BK):
            j1 = min(Tk, j0 + BK)
            for r in range(rows):
                lim = min(j1, lo + r + shift + 1) if causal else j1
                for j in range(j0, j1):                    # the tile's scores, then the mask
                    t = q.dtype.type(0)
                    for c in range(d):
                        t += q[h, lo + r, c] * k[h, j, c]
                    s[j - j0] = t * scale if j < lim else -np.inf
                if lim <= j0:
                    continue
                top = run_max[r]
                for j in range(j0, lim):
                    top = max(top, s[j - j0])
                f = math.exp(run_max[r] - top)
                run_sum[r] *= f
                for c in range(dv):
                    acc[r, c] *= f
                for j in range(j0, lim):
                    w = math.exp(s[j - j0] - top)
                    run_sum[r] += w
                    for c in range(dv):
                        acc[r, c] += w * v[h, j, c]
                run_max[r] = top
        for r in range(rows):
            for c in range(dv):
                out[h, lo + r, c] = acc[r, c] / run_sum[r]
            lse[h, lo + r] = run_max[r] + math.log(run_sum[r])


@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_square_mask(q, k, v, out, lse, scale, causal, BQ, BK):
    """Wrong: the causal mask as if Tq == Tk (query i sees keys 0..i)."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    n_qt = (Tq + BQ - 1) // BQ
    for job in prange(BH * n_qt):
        qt, h = job // BH, job % BH
        lo = qt * BQ
        hi = min(Tq, lo + BQ)
        rows = hi - lo
        run_max = np.full(rows, -np.inf, q.dtype)
        run_sum = np.zeros(rows, q.dtype)
        acc = np.zeros((rows, dv), q.dtype)
        s = np.empty(BK, q.dtype)
        kend = min(Tk, hi) if causal else Tk
        for j0 in range(0, kend, BK):
            j1 = min(kend, j0 + BK)
            for r in range(rows):
                lim = min(j1, lo + r + 1) if causal else j1
                if lim <= j0:
                    continue
                top = run_max[r]
                for j in range(j0, lim):
                    t = q.dtype.type(0)
                    for c in range(d):
                        t += q[h, lo + r, c] * k[h, j, c]
                    s[j - j0] = t * scale
                    top = max(top, s[j - j0])
                f = math.exp(run_max[r] - top)
                run_sum[r] *= f
                for c in range(dv):
                    acc[r, c] *= f
                for j in range(j0, lim):
                    w = math.exp(s[j - j0] - top)
                    run_sum[r] += w
                    for c in range(dv):
                        acc[r, c] += w * v[h, j, c]
                run_max[r] = top
        for r in range(rows):
            for c in range(dv):
                out[h, lo + r, c] = acc[r, c] / run_sum[r]
            lse[h, lo + r] = run_max[r] + math.log(run_sum[r])


# ---------------------------------------------------------------- 4. flash backward

@numba.njit(parallel=True, fastmath=FM, cache=True)
def fb_two_sweeps(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK):
    """Correct, FlashAttention-2's split: one sweep of tasks per (head, key tile) writes dk and dv, a second
    per (head, query tile) writes dq; explicit loops, every probability rebuilt from lse."""
    BH, Tq, d = q.shape
    Tk, dvs = k.shape[1], v.shape[2]
    shift = Tk - Tq
    Drow = np.empty((BH, Tq), q.dtype)
    for job in prange(BH * Tq):
        h, i = job // Tq, job % Tq
        t = q.dtype.type(0)
        for c in range(dvs):
            t += do[h, i, c] * o[h, i, c]
        Drow[h, i] = t
    n_kt = (Tk + BK - 1) // BK
    for job in prange(BH * n_kt):
        h, j0 = job // n_kt, job % n_kt * BK
        j1 = min(Tk, j0 + BK)
        gk = np.zeros((j1 - j0, d), q.dtype)
        gv = np.zeros((j1 - j0, dvs), q.dtype)
        first = max(0, j0 - shift) if causal else 0          # the first query that sees key j0
        for i in range(first, Tq):
            for j in range(j0, j1):
                if causal and j > i + shift:
                    break
                t = q.dtype.type(0)
                for c in range(d):
                    t += q[h, i, c] * k[h, j, c]
                p = math.exp(t * scale - lse[h, i])
                dp = q.dtype.type(0)
                for c in range(dvs):
                    dp += do[h, i, c] * v[h, j, c]
                    gv[j - j0, c] += p * do[h, i, c]
                ds = p * (dp - Drow[h, i]) * scale
                for c in range(d):
                    gk[j - j0, c] += ds * q[h, i, c]
        for j in range(j0, j1):
            for c in range(d):
                dk[h, j, c] = gk[j - j0, c]
            for c in range(dvs):
                dv[h, j, c] = gv[j - j0, c]
    n_qt = (Tq + BQ - 1) // BQ
    for job in prange(BH * n_qt):
        h, i0 = job // n_qt, job % n_qt * BQ
        for i in range(i0, min(Tq, i0 + BQ)):
            g = np.zeros(d, q.dtype)
            last = min(Tk, i + shift + 1) if causal else Tk
            for j in range(last):
                t = q.dtype.type(0)
                for c in range(d):
                    t += q[h, i, c] * k[h, j, c]
                p = math.exp(t * scale - lse[h, i])
                dp = q.dtype.type(0)
                for c in range(dvs):
                    dp += do[h, i, c] * v[h, j, c]
                ds = p * (dp - Drow[h, i]) * scale
                for c in range(d):
                    g[c] += ds * k[h, j, c]
            for c in range(d):
                dq[h, i, c] = g[c]


@numba.njit(parallel=True, fastmath=FM, cache=True)
def fb_stores_P(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK):
    """Right numbers; each head's whole P (Tq, Tk) stored: memory grows as T^2."""
    BH, Tq, d = q.shape
    Tk, dvs = k.shape[1], v.shape[2]
    shift = Tk - Tq
    for h in prange(BH):
        P = np.zeros((Tq, Tk), q.dtype)
        dS = np.zeros((Tq, Tk), q.dtype)
        for i in range(Tq):
            last = min(Tk, i + shift + 1) if causal else Tk
            Di = q.dtype.type(0)
            for c in range(dvs):
                Di += do[h, i, c] * o[h, i, c]
            for j in range(last):
                t = q.dtype.type(0)
                for c in range(d):
                    t += q[h, i, c] * k[h, j, c]
                P[i, j] = math.exp(t * scale - lse[h, i])
                dp = q.dtype.type(0)
                for c in range(dvs):
                    dp += do[h, i, c] * v[h, j, c]
                dS[i, j] = P[i, j] * (dp - Di) * scale
        for i in range(Tq):
            for c in range(d):
                t = q.dtype.type(0)
                for j in range(Tk):
                    t += dS[i, j] * k[h, j, c]
                dq[h, i, c] = t
        for j in range(Tk):
            for c in range(d):
                t = q.dtype.type(0)
                for i in range(Tq):
                    t += dS[i, j] * q[h, i, c]
                dk[h, j, c] = t
            for c in range(dvs):
                t = q.dtype.type(0)
                for i in range(Tq):
                    t += P[i, j] * do[h, i, c]
                dv[h, j, c] = t


@numba.njit(parallel=True, fastmath=FM, cache=True)
def fb_no_skip_matmul(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK):
    """Right numbers; every (query tile, key tile) pair visited with tile products, hidden entries set to 0."""
    BH, Tq, d = q.shape
    Tk, dvs = k.shape[1], v.shape[2]
    shift = Tk - Tq
    for h in prange(BH):
        Drow = np.empty(Tq, q.dtype)
        for i in range(Tq):
            t = q.dtype.type(0)
            for c in range(dvs):
                t += do[h, i, c] * o[h, i, c]
            Drow[i] = t
            for c in range(d):
                dq[h, i, c] = 0
        S = np.empty((BQ, BK), q.dtype)
        G = np.empty((BQ, BK), q.dtype)
        St = np.empty((BK, BQ), q.dtype)
        Gt = np.empty((BK, BQ), q.dtype)
        kT = np.empty((d, BK), q.dtype)
        qT = np.empty((d, BQ), q.dtype)
        doT = np.empty((dvs, BQ), q.dtype)
        gk = np.empty((BK, d), q.dtype)
        gv = np.empty((BK, dvs), q.dtype)
        for j0 in range(0, Tk, BK):
            nk = min(BK, Tk - j0)
            gk[:, :] = 0
            gv[:, :] = 0
            transpose(k[h, j0:], kT, nk, d)
            for i0 in range(0, Tq, BQ):
                nq = min(BQ, Tq - i0)
                matmul_bt(q[h, i0:], k[h, j0:], S, nq, nk, d, False)
                matmul_bt(do[h, i0:], v[h, j0:], G, nq, nk, dvs, False)
                for i in range(nq):
                    for j in range(nk):
                        if causal and j0 + j > i0 + i + shift:
                            S[i, j] = 0
                            G[i, j] = 0
                        else:
                            S[i, j] = math.exp(S[i, j] * scale - lse[h, i0 + i])
                            G[i, j] = S[i, j] * (G[i, j] - Drow[i0 + i])
                transpose(S, St, nq, nk)
                transpose(G, Gt, nq, nk)
                transpose(do[h, i0:], doT, nq, dvs)
                transpose(q[h, i0:], qT, nq, d)
                matmul_bt(St, doT, gv, nk, dvs, nq, True)
                matmul_bt(Gt, qT, gk, nk, d, nq, True)
                matmul_bt(G, kT, dq[h, i0:], nq, d, nk, True)
            for j in range(nk):
                for c in range(d):
                    dk[h, j0 + j, c] = gk[j, c] * scale
                for c in range(dvs):
                    dv[h, j0 + j, c] = gv[j, c]
        for i in range(Tq):
            for c in range(d):
                dq[h, i, c] *= scale


@numba.njit(parallel=True, fastmath=FM, cache=True)
def fb_no_skip_loops(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK):
    """Right numbers; every (query tile, key tile) pair visited: the tile's scores and dP computed for all its
    entries (hidden queries and keys read), hidden ones set to 0, products over the visible ones only."""
    BH, Tq, d = q.shape
    Tk, dvs = k.shape[1], v.shape[2]
    shift = Tk - Tq
    for h in prange(BH):
        Drow = np.empty(Tq, q.dtype)
        for i in range(Tq):
            t = q.dtype.type(0)
            for c in range(dvs):
                t += do[h, i, c] * o[h, i, c]
            Drow[i] = t
            for c in range(d):
                dq[h, i, c] = 0
        for j in range(Tk):
            for c in range(d):
                dk[h, j, c] = 0
            for c in range(dvs):
                dv[h, j, c] = 0
        P = np.empty((BQ, BK), q.dtype)
        dS = np.empty((BQ, BK), q.dtype)
        for i0 in range(0, Tq, BQ):
            nq = min(BQ, Tq - i0)
            for j0 in range(0, Tk, BK):
                nk = min(BK, Tk - j0)
                for i in range(nq):
                    for j in range(nk):
                        t = q.dtype.type(0)
                        for c in range(d):
                            t += q[h, i0 + i, c] * k[h, j0 + j, c]
                        dp = q.dtype.type(0)
                        for c in range(dvs):
                            dp += do[h, i0 + i, c] * v[h, j0 + j, c]
                        if causal and j0 + j > i0 + i + shift:
                            P[i, j] = 0
                            dS[i, j] = 0
                        else:
                            P[i, j] = math.exp(t * scale - lse[h, i0 + i])
                            dS[i, j] = P[i, j] * (dp - Drow[i0 + i]) * scale
                for i in range(nq):
                    for j in range(nk):
                        if causal and j0 + j > i0 + i + shift:
                            continue
                        for c in range(dvs):
                            dv[h, j0 + j, c] += P[i, j] * do[h, i0 + i, c]
                        for c in range(d):
                            dk[h, j0 + j, c] += dS[i, j] * q[h, i0 + i, c]
                            dq[h, i0 + i, c] += dS[i, j] * k[h, j0 + j, c]


@numba.njit(parallel=True, fastmath=FM, cache=True)
def fb_dq_not_zeroed(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK):
    """Wrong: adds into dq, which arrives full of NaN."""
    BH, Tq, d = q.shape
    Tk, dvs = k.shape[1], v.shape[2]
    shift = Tk - Tq
    for h in prange(BH):
        for j in range(Tk):
            for c in range(d):
                dk[h, j, c] = 0
            for c in range(dvs):
                dv[h, j, c] = 0
        for i in range(Tq):
            Di = q.dtype.type(0)
            for c in range(dvs):
                Di += do[h, i, c] * o[h, i, c]
            last = min(Tk, i + shift + 1) if causal else Tk
            for j in range(last):
                t = q.dtype.type(0)
                for c in range(d):
                    t += q[h, i, c] * k[h, j, c]
                p = math.exp(t * scale - lse[h, i])
                dp = q.dtype.type(0)
                for c in range(dvs):
                    dp += do[h, i, c] * v[h, j, c]
                    dv[h, j, c] += p * do[h, i, c]
                ds = p * (dp - Di) * scale
                for c in range(d):
                    dk[h, j, c] += ds * q[h, i, c]
                    dq[h, i, c] += ds * k[h, j, c]


@numba.njit(parallel=True, fastmath=FM, cache=True)
def fb_dk_unscaled(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK):
    """Wrong: forgets the scale in dK."""
    BH, Tq, d = q.shape
    Tk, dvs = k.shape[1], v.shape[2]
    shift = Tk - Tq
    for h in prange(BH):
        for j in range(Tk):
            for c in range(d):
                dk[h, j, c] = 0
            for c in range(dvs):
                dv[h, j, c] = 0
        for i in range(Tq):
            for c in range(d):
                dq[h, i, c] = 0
            Di = q.dtype.type(0)
            for c in range(dvs):
                Di += do[h, i, c] * o[h, i, c]
            last = min(Tk, i + shift + 1) if causal else Tk
            for j in range(last):
                t = q.dtype.type(0)
                for c in range(d):
                    t += q[h, i, c] * k[h, j, c]
                p = math.exp(t * scale - lse[h, i])
                dp = q.dtype.type(0)
                for c in range(dvs):
                    dp += do[h, i, c] * v[h, j, c]
                    dv[h, j, c] += p * do[h, i, c]
                ds = p * (dp - Di)
                for c in range(d):
                    dk[h, j, c] += ds * q[h, i, c]
                    dq[h, i, c] += ds * k[h, j, c] * scale


# ---------------------------------------------------------------- 6. the operator

def register_attention_functional(name, forward_kernel, backward_kernel):
    """Correct, written another way: the function forms of torch.library, outputs made (B*H, T, .) and viewed
    back, the backward op defined first."""
    def heads(t):
        t = t.detach().contiguous()
        return t.view(-1, t.shape[-2], t.shape[-1]).numpy()

    @torch.library.custom_op(name + "_backward", mutates_args=())
    def grads_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, dout: torch.Tensor,
                 lse: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, H = q.shape[0], q.shape[1]
        dq = torch.empty(B * H, *q.shape[2:], dtype=q.dtype)
        dk = torch.empty(B * H, *k.shape[2:], dtype=k.dtype)
        dv = torch.empty(B * H, *v.shape[2:], dtype=v.dtype)
        qn = heads(q)
        lse_n = lse.detach().contiguous().view(B * H, -1).numpy()
        backward_kernel(qn, heads(k), heads(v), heads(out), heads(dout), lse_n, dq.numpy(), dk.numpy(), dv.numpy(),
                        np.dtype(qn.dtype).type(scale), causal, 64, 64)
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)

    torch.library.register_fake(name + "_backward")(
        lambda q, k, v, out, dout, lse, causal, scale: (torch.empty_like(q, memory_format=torch.contiguous_format),
                                                         torch.empty_like(k, memory_format=torch.contiguous_format),
                                                         torch.empty_like(v, memory_format=torch.contiguous_format)))

    @torch.library.custom_op(name, mutates_args=())
    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        B, H, T = q.shape[:3]
        out = torch.empty(B * H, T, v.shape[-1], dtype=q.dtype)
        lse = torch.empty(B * H, T, dtype=q.dtype)
        qn = heads(q)
        forward_kernel(qn, heads(k), heads(v), out.numpy(), lse.numpy(), np.dtype(qn.dtype).type(scale), causal, 64, 64)
        return out.view(B, H, T, -1), lse.view(B, H, T)

    def fake(q, k, v, causal, scale):
        B, H, T = q.shape[:3]
        return q.new_empty(B, H, T, v.shape[-1]), q.new_empty(B, H, T)

    torch.library.register_fake(name)(fake)

    def setup(ctx, inputs, output):
        q, k, v, causal, scale = inputs
        out, lse = output
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.flags = (causal, scale)

    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        causal, scale = ctx.flags
        dq, dk, dv = grads_op(q, k, v, out, grad_out, lse, causal, scale)
        return dq, dk, dv, None, None

    torch.library.register_autograd(name, backward, setup_context=setup)
    return attn


def register_attention_numpy_backward(name, forward_kernel, backward_kernel):
    """Right numbers; the backward formula calls the kernel on .numpy() itself, with no backward op."""
    def heads(t):
        return t.detach().contiguous().reshape(-1, *t.shape[2:]).numpy()

    @torch.library.custom_op(name, mutates_args=())
    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = q.new_empty(*q.shape[:3], v.shape[-1]), q.new_empty(q.shape[:3])
        qn = heads(q)
        forward_kernel(qn, heads(k), heads(v), heads(out), heads(lse), qn.dtype.type(scale), causal, 64, 64)
        return out, lse

    @attn.register_fake
    def _(q, k, v, causal, scale):
        return q.new_empty(*q.shape[:3], v.shape[-1]), q.new_empty(q.shape[:3])

    def setup(ctx, inputs, output):
        q, k, v, causal, scale = inputs
        ctx.save_for_backward(q, k, v, *output)
        ctx.mark_non_differentiable(output[1])
        ctx.causal, ctx.scale = causal, scale

    def backward(ctx, dout, _):
        q, k, v, out, lse = ctx.saved_tensors
        grads = [torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v)]
        qn = heads(q)
        backward_kernel(qn, heads(k), heads(v), heads(out), heads(dout), heads(lse), *map(heads, grads),
                        qn.dtype.type(ctx.scale), ctx.causal, 64, 64)
        return *grads, None, None

    attn.register_autograd(backward, setup_context=setup)
    return attn


def register_attention_empty_like(name, forward_kernel, backward_kernel):
    """Wrong: out = empty_like(q) keeps q's transposed strides, so the numpy view the kernel writes is a copy."""
    def heads(t):
        return t.detach().contiguous().reshape(-1, *t.shape[2:]).numpy()

    @torch.library.custom_op(name, mutates_args=())
    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
        qn = heads(q)
        forward_kernel(qn, heads(k), heads(v), out.reshape(-1, *out.shape[2:]).numpy(), heads(lse),
                       qn.dtype.type(scale), causal, 64, 64)
        return out, lse

    @attn.register_fake
    def _(q, k, v, causal, scale):
        return torch.empty_like(q), q.new_empty(q.shape[:3])

    @torch.library.custom_op(name + "_backward", mutates_args=())
    def grads_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, dout: torch.Tensor,
                 lse: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        grads = [torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v)]
        qn = heads(q)
        backward_kernel(qn, heads(k), heads(v), heads(out), heads(dout), heads(lse), *map(heads, grads),
                        qn.dtype.type(scale), causal, 64, 64)
        return tuple(grads)

    @grads_op.register_fake
    def _(q, k, v, out, dout, lse, causal, scale):
        return tuple(torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v))

    def setup(ctx, inputs, output):
        q, k, v, causal, scale = inputs
        ctx.save_for_backward(q, k, v, *output)
        ctx.mark_non_differentiable(output[1])
        ctx.causal, ctx.scale = causal, scale

    def backward(ctx, dout, _):
        q, k, v, out, lse = ctx.saved_tensors
        return *grads_op(q, k, v, out, dout, lse, ctx.causal, ctx.scale), None, None

    attn.register_autograd(backward, setup_context=setup)
    return attn


# ---------------------------------------------------------------- the cases

ACCEPT = [
    ("online_update", lambda: check.online_softmax_update(online_update_rows)),
    ("fused_scan", lambda: check.fused_scan(scan_channels_outer)),
    ("flash_forward", lambda: check.flash_forward(ff_rowwise_online)),
    ("flash_backward", lambda: check.flash_backward(fb_two_sweeps)),
    ("attention_op", lambda: check.attention_op(register_attention_functional)),
]

REJECT = [
    ("online_no_rescale", lambda: check.online_softmax_update(online_no_rescale)),
    ("online_rescale_l_only", lambda: check.online_softmax_update(online_rescale_l_only)),
    ("online_exp_then_shift", lambda: check.online_softmax_update(online_exp_then_shift)),
    ("scan_keeps_history", lambda: check.fused_scan(scan_keeps_history)),
    ("scan_serial", lambda: check.fused_scan(scan_serial)),
    ("scan_ckpt_after_step", lambda: check.fused_scan(scan_ckpt_after_step)),
    ("scan_float64_state", lambda: check.fused_scan(scan_float64_state)),
    ("ff_whole_row", lambda: check.flash_forward(ff_whole_row)),
    ("ff_two_pass", lambda: check.flash_forward(ff_two_pass)),
    ("ff_max_from_zero", lambda: check.flash_forward(ff_max_from_zero)),
    ("ff_all_tiles_weight_zero", lambda: check.flash_forward(ff_all_tiles_weight_zero)),
    ("ff_all_tiles_scores_only", lambda: check.flash_forward(ff_all_tiles_scores_only)),
    ("ff_square_mask", lambda: check.flash_forward(ff_square_mask)),
    ("ff_serial", lambda: check.flash_forward(ff_serial)),
    ("ff_heads_parallel", lambda: check.flash_forward(ff_heads_parallel)),
    ("fb_stores_P", lambda: check.flash_backward(fb_stores_P)),
    ("fb_no_skip_matmul", lambda: check.flash_backward(fb_no_skip_matmul)),
    ("fb_no_skip_loops", lambda: check.flash_backward(fb_no_skip_loops)),
    ("fb_dq_not_zeroed", lambda: check.flash_backward(fb_dq_not_zeroed)),
    ("fb_dk_unscaled", lambda: check.flash_backward(fb_dk_unscaled)),
    ("op_numpy_backward", lambda: check.attention_op(register_attention_numpy_backward)),
    ("op_empty_like", lambda: check.attention_op(register_attention_empty_like)),
]


@pytest.mark.parametrize("name, run", ACCEPT, ids=[c[0] for c in ACCEPT])
def test_accept(name, run):
    run()


@pytest.mark.parametrize("name, run", REJECT, ids=[c[0] for c in REJECT])
def test_reject(name, run):
    with pytest.raises(CheckFailed) as info:
        run()
    print(str(info.value)[:800])
