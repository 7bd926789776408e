"""Chapter 10's checks pass on the reference kernels and on correct kernels written differently, and reject
the usual mistakes, including kernels whose values are right but which break the property the chapter
teaches: a scan that keeps every state, a forward whose scratch grows with the keys (a row of scores, a
strip of them per task), a running max that starts at 0, kernels that read the causal tiles no query sees
(whatever their masking style), a CUDA kernel without its barriers, an op that works eagerly but cannot be
traced.

The references are the course's own kernels (the answer key's). The other kernels are written in numpy
where a check only sees values and memory (fast, nothing to compile), in Numba where threads matter (a
prange whose tasks each hold a strip of scores: its memory depends on the thread count), and as CUDA
kernels on the simulator where the shared tiles are the point. Run them with NUMBA_NUM_THREADS=2 and 16:
every verdict must be the same.
"""

import itertools
import math

import numba
import numpy as np
import pytest
import torch
from checking import expect_failure, expect_pass
from numba import prange

from course_lib import device

device.setup(verbose=False)
from numba import cuda, float64  # noqa: E402  (after the device is chosen)

from course_lib.checks import ch10 as check  # noqa: E402
from course_lib.fused import attention_cpu, attention_cuda, attention_op, scan_cpu  # noqa: E402
from course_lib.simd.fastexp import exp_neg  # noqa: E402
from course_lib.simd.tiles import matmul_bt  # noqa: E402

TILE, D_MAX = 16, 16
T = torch.Tensor
FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


def _stub(*args, **kwargs):
    raise NotImplementedError


# ---- 1. the online-softmax update ---------------------------------------------------------------

def update(m, l, acc, scores, values, rescale_l=True, rescale_acc=True, shifted=True):
    """shifted=False keeps the sums relative to 0 instead of the running max: right on small scores, but
    exp of a large score overflows (the reason for the max)."""
    m_new = np.maximum(m, scores.max(1))
    if not shifted:
        with np.errstate(all="ignore"):
            l_abs, acc_abs = l * np.exp(m) + np.exp(scores).sum(1), acc * np.exp(m)[:, None] + np.exp(scores) @ values
            return m_new, l_abs * np.exp(-m_new), acc_abs * np.exp(-m_new)[:, None]
    alpha = np.exp(m - m_new)
    p = np.exp(scores - m_new[:, None])
    l_new = (alpha * l if rescale_l else l) + p.sum(1)
    acc_new = (alpha[:, None] * acc if rescale_acc else acc) + p @ values
    return m_new, l_new, acc_new


def update_by_rows(m, l, acc, scores, values):
    """Correct, written another way: one row at a time, the old state and the tile merged as two partial
    softmaxes in log space (logaddexp), the accumulator rebuilt from both weights."""
    m_out, l_out, acc_out = np.empty_like(m), np.empty_like(l), np.empty_like(acc)
    for r in range(len(m)):
        row = scores[r]
        top = max(m[r], row.max())
        old_w = math.exp(m[r] - top) if m[r] > -math.inf else 0.0
        new_w = np.exp(row - top)
        with np.errstate(divide="ignore"):                 # a fully masked row of the tile has no weight
            log_l = np.logaddexp(np.log(l[r]) + m[r] if l[r] > 0 else -np.inf, np.log(new_w.sum()) + top)
        m_out[r], l_out[r] = top, math.exp(log_l - top)
        acc_out[r] = old_w * acc[r] + new_w @ values
    return m_out, l_out, acc_out


def test_online_softmax_update_accepts_the_course_answer_and_another_correct_one():
    expect_pass(check.online_softmax_update, update)
    expect_pass(check.online_softmax_update, update_by_rows)
    expect_failure(check.online_softmax_update, _stub, match="not implemented yet")


@pytest.mark.parametrize("wrong, match", [
    (lambda *a: update(*a, rescale_l=False), "still counts as if on the old max"),
    (lambda *a: update(*a, rescale_acc=False), "still counts as if on the old max"),
    (lambda m, l, acc, s, v: update(np.full_like(m, -np.inf), l, acc, s, v), "forgot the old m"),
    (lambda *a: update(*a, shifted=False), "l, the new running sum"),     # right on small scores, overflows on big ones
])
def test_online_softmax_update_rejects(wrong, match):
    expect_failure(check.online_softmax_update, wrong, match=match)


def test_online_softmax_messages_name_the_idea_not_the_line():
    """A check message says what differs and the likely mistake as an idea: never the update's formula."""
    message = expect_failure(check.online_softmax_update, lambda *a: update(*a, rescale_l=False))
    assert "exp(m_old - m_new)" not in message and "multiply" not in message


# ---- 2. the fused scan ----------------------------------------------------------------------------

def scan_numpy(x, delta, A, B, C, D, y, h_last, ckpt, chunk, history=False, ckpt_after=False, skip=True,
               write_last=True, wide_state=False):
    """One channel at a time, in numpy; history=True keeps the (L, N) states of the channel (right values),
    wide_state=True keeps the state in float64 whatever the inputs (right values, more exact)."""
    bsz, L, Dm = x.shape
    for b, d in itertools.product(range(bsz), range(Dm)):
        h = np.zeros(A.shape[1], np.float64 if wide_state else x.dtype)
        states = np.empty((L, A.shape[1]), x.dtype) if history else None
        for t in range(L):
            if t % chunk == 0 and not ckpt_after:
                ckpt[b, t // chunk, d] = h
            h = np.exp(delta[b, t, d] * A[d]) * h + delta[b, t, d] * x[b, t, d] * B[b, t]
            if t % chunk == 0 and ckpt_after:
                ckpt[b, t // chunk, d] = h
            if history:
                states[t] = h
            y[b, t, d] = C[b, t] @ h + (D[d] * x[b, t, d] if skip else 0)
        if write_last:
            h_last[b, d] = h


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def scan_by_batch_row(x, delta, A, B, C, D, y, h_last, ckpt, chunk):
    """Correct, written another way: a task per batch row holding every channel's state (D, N), the time
    loop outside the channel loop, checkpoints taken chunk by chunk, the decay from exp_neg."""
    bsz, L, Dm = x.shape
    N = A.shape[1]
    for b in prange(bsz):
        state = np.zeros((Dm, N), x.dtype)
        for c0 in range(0, L, chunk):
            for d in range(Dm):
                for n in range(N):
                    ckpt[b, c0 // chunk, d, n] = state[d, n]
            for t in range(c0, min(L, c0 + chunk)):
                for d in range(Dm):
                    step = delta[b, t, d]
                    out = D[d] * x[b, t, d]
                    for n in range(N):
                        state[d, n] = state[d, n] * exp_neg(step * A[d, n]) + step * x[b, t, d] * B[b, t, n]
                        out += state[d, n] * C[b, t, n]
                    y[b, t, d] = out
        for d in range(Dm):
            for n in range(N):
                h_last[b, d, n] = state[d, n]


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def scan_keeping_steps(x, delta, A, B, C, D, y, h_last, ckpt, chunk):
    """Right values, but each pair keeps its L inputs dt * x (a buffer that grows with L): not fused."""
    bsz, L, Dm = x.shape
    N = A.shape[1]
    for i in prange(bsz * Dm):
        b, d = i // Dm, i % Dm
        u = np.empty(L, x.dtype)
        for t in range(L):
            u[t] = delta[b, t, d] * x[b, t, d]
        h = np.zeros(N, x.dtype)
        for t in range(L):
            if t % chunk == 0:
                for n in range(N):
                    ckpt[b, t // chunk, d, n] = h[n]
            acc = D[d] * x[b, t, d]
            for n in range(N):
                h[n] = exp_neg(delta[b, t, d] * A[d, n]) * h[n] + u[t] * B[b, t, n]
                acc += C[b, t, n] * h[n]
            y[b, t, d] = acc
        for n in range(N):
            h_last[b, d, n] = h[n]


def test_fused_scan_accepts_the_course_kernel_and_other_correct_ones():
    expect_pass(check.fused_scan, scan_cpu.scan_forward)
    expect_pass(check.fused_scan, scan_numpy)
    expect_pass(check.fused_scan, scan_by_batch_row)
    expect_failure(check.fused_scan, _stub, match="not implemented yet")


@pytest.mark.parametrize("wrong, match", [
    (lambda *a: scan_numpy(*a, history=True), "grows with L"),       # right values, an (L, N) history
    (scan_keeping_steps, "grows with L"),                            # right values, an (L,) buffer per pair, parallel
    (lambda *a: scan_numpy(*a, ckpt_after=True), "state after their step"),
    (lambda *a: scan_numpy(*a, skip=False), "D skip"),
    (lambda *a: scan_numpy(*a, write_last=False), "h_last"),
    (lambda *a: scan_numpy(*a, wide_state=True), "float32 work must stay float32"),
])
def test_fused_scan_rejects(wrong, match):
    expect_failure(check.fused_scan, wrong, match=match)


# ---- 3. and 4. FlashAttention, right and wrong ----------------------------------------------------

def flash_numpy(q, k, v, out, lse, scale, causal, BQ, BK, shift=0, first_keys=False, drop_last=False,
                no_scale=False, lse_is_m=False, skip_last_rows=False, whole=False, no_skip=False, m_start=-np.inf,
                scores_only=False):
    """Tiled attention with the online softmax in numpy; whole=True builds each head's (T, T) scores,
    no_skip=True visits the causal tiles above the diagonal (right values, twice the work), scores_only=True
    computes their scores, masks them all and moves on (no product with V reads a hidden value), m_start=0
    starts the running max at 0 (right values unless every score is far below 0)."""
    BH, Tq, _ = q.shape
    Tk = k.shape[1]
    offset = 0 if first_keys else Tk - Tq
    scale = 1.0 if no_scale else scale
    for h in range(BH):
        if whole:
            s = q[h] @ k[h].T * scale
            if causal:
                s[np.arange(Tk)[None, :] > np.arange(Tq)[:, None] + offset] = -np.inf
            m = s.max(1)
            p = np.exp(s - m[:, None])
            out[h] = p @ v[h] / p.sum(1)[:, None]
            lse[h] = m + np.log(p.sum(1))
            continue
        for i0 in range(0, Tq - (Tq % BQ if skip_last_rows else 0), BQ):
            qi = q[h, i0:i0 + BQ]
            rows = np.arange(i0, i0 + len(qi))[:, None]
            m, den, acc = np.full(len(qi), m_start), np.zeros(len(qi)), np.zeros((len(qi), v.shape[2]))
            k_stop = Tk // BK * BK if drop_last else Tk
            if causal and not (no_skip or scores_only):
                k_stop = max(0, min(k_stop, i0 + len(qi) + offset + shift))
            for j0 in range(0, k_stop, BK):
                s = qi @ k[h, j0:j0 + BK].T * scale
                if causal:
                    s = np.where(np.arange(j0, j0 + s.shape[1])[None, :] <= rows + offset + shift, s, -np.inf)
                if scores_only and np.isneginf(s).all():
                    continue
                m_new = np.maximum(m, s.max(1))
                alpha, p = np.exp(m - m_new), np.exp(s - m_new[:, None])
                den, acc, m = alpha * den + p.sum(1), alpha[:, None] * acc + p @ v[h, j0:j0 + BK], m_new
            out[h, i0:i0 + BQ] = acc / den[:, None]
            lse[h, i0:i0 + BQ] = m if lse_is_m else m + np.log(den)


def rows_numpy(q, k, v, out, lse, scale, causal, BQ, BK):
    """Right values, no online softmax: each query row takes all its scores at once, a row of Tk numbers."""
    Tq, Tk = q.shape[1], k.shape[1]
    for h, i in itertools.product(range(q.shape[0]), range(Tq)):
        n = i + Tk - Tq + 1 if causal else Tk
        s = k[h, :n] @ q[h, i] * scale
        top = s.max()
        w = np.exp(s - top)
        out[h, i] = w @ v[h, :n] / w.sum()
        lse[h, i] = top + np.log(w.sum())


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def strip_forward(q, k, v, out, lse, scale, causal, BQ, BK):
    """Right values, two passes over a (BQ, Tk) strip of scores per (head, query tile) task: its memory
    grows with Tk, by one strip per thread running (so an absolute bound would depend on the threads)."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    n = (Tq + BQ - 1) // BQ
    for task in prange(BH * n):
        h, i0 = task // n, task % n * BQ
        nq = min(BQ, Tq - i0)
        strip = np.empty((nq, Tk), q.dtype)
        for i in range(nq):
            seen = i0 + i + Tk - Tq + 1 if causal else Tk
            top = -np.inf
            for j in range(seen):
                total = q.dtype.type(0)
                for c in range(d):
                    total += q[h, i0 + i, c] * k[h, j, c]
                strip[i, j] = total * scale
                top = max(top, strip[i, j])
            denom = q.dtype.type(0)
            for j in range(seen):
                strip[i, j] = math.exp(strip[i, j] - top)
                denom += strip[i, j]
            for c in range(dv):
                total = q.dtype.type(0)
                for j in range(seen):
                    total += strip[i, j] * v[h, j, c]
                out[h, i0 + i, c] = total / denom
            lse[h, i0 + i] = top + math.log(denom)


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def rows_online_forward(q, k, v, out, lse, scale, causal, BQ, BK):
    """Correct, written another way: a task per (head, query row), the online softmax over key tiles of BK,
    one row of scores and one accumulator per task, the exp from exp_neg."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    for task in prange(BH * Tq):
        h, i = task // Tq, task % Tq
        last = i + Tk - Tq + 1 if causal else Tk           # keys 0 .. last - 1
        row, acc = np.empty(BK, q.dtype), np.zeros(dv, q.dtype)
        running, mass = -np.inf, q.dtype.type(0)
        for j0 in range(0, last, BK):
            nk = min(BK, last - j0)
            peak = running
            for j in range(nk):
                total = q.dtype.type(0)
                for c in range(d):
                    total += q[h, i, c] * k[h, j0 + j, c]
                row[j] = total * scale
                peak = max(peak, row[j])
            shrink = exp_neg(running - peak)
            mass *= shrink
            for c in range(dv):
                acc[c] *= shrink
            for j in range(nk):
                w = exp_neg(row[j] - peak)
                mass += w
                for c in range(dv):
                    acc[c] += w * v[h, j0 + j, c]
            running = peak
        for c in range(dv):
            out[h, i, c] = acc[c] / mass
        lse[h, i] = running + math.log(mass)


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def all_tiles_forward(q, k, v, out, lse, scale, causal, BQ, BK):
    """Right values, every key tile visited: hidden scores are set to -inf by assignment, so their weights
    are 0, and the tile product with V still runs (twice the work at large T)."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    n = (Tq + BQ - 1) // BQ
    for task in prange(BH * n):
        h, i0 = task // n, task % n * BQ
        nq = min(BQ, Tq - i0)
        s, acc = np.empty((nq, BK), q.dtype), np.zeros((nq, dv), q.dtype)
        m, l = np.full(nq, -np.inf, q.dtype), np.zeros(nq, q.dtype)
        for j0 in range(0, Tk, BK):
            nk = min(BK, Tk - j0)
            matmul_bt(q[h, i0:], k[h, j0:], s, nq, nk, d, False)
            for i in range(nq):
                top = m[i]
                for j in range(nk):
                    s[i, j] = s[i, j] * scale if not causal or j0 + j <= i0 + i + Tk - Tq else -np.inf
                    top = max(top, s[i, j])
                alpha = math.exp(m[i] - top)
                l[i] *= alpha
                for c in range(dv):
                    acc[i, c] *= alpha
                for j in range(nk):
                    s[i, j] = math.exp(s[i, j] - top)
                    l[i] += s[i, j]
                m[i] = top
            for i in range(nq):
                for j in range(nk):
                    for c in range(dv):
                        acc[i, c] += s[i, j] * v[h, j0 + j, c]
        for i in range(nq):
            for c in range(dv):
                out[h, i0 + i, c] = acc[i, c] / l[i]
            lse[h, i0 + i] = m[i] + math.log(l[i])


def rows_scoring_every_key():
    """Right values, a row at a time with the online softmax, but every key's score is computed (by a helper
    reached through a closure) before the mask drops it: no hidden value is used, so no NaN shows."""
    @numba.njit
    def score(q, k, h, i, j):
        t = 0.0
        for c in range(q.shape[2]):
            t += q[h, i, c] * k[h, j, c]
        return t

    @numba.njit(parallel=True)
    def kernel(q, k, v, out, lse, scale, causal, BQ, BK):
        BH, Tq, _ = q.shape
        Tk, dv = k.shape[1], v.shape[2]
        for task in prange(BH * Tq):
            h, i = task // Tq, task % Tq
            last = i + Tk - Tq if causal else Tk - 1
            m, total, acc = -np.inf, 0.0, np.zeros(dv)
            for j in range(Tk):
                s = score(q, k, h, i, j) * scale
                if j > last:
                    continue
                top = max(m, s)
                shrink, w = math.exp(m - top), math.exp(s - top)
                total = total * shrink + w
                for c in range(dv):
                    acc[c] = acc[c] * shrink + w * v[h, j, c]
                m = top
            for c in range(dv):
                out[h, i, c] = acc[c] / total
            lse[h, i] = m + math.log(total)
    return kernel


def test_flash_forward_accepts_the_course_kernel_and_other_correct_ones():
    expect_pass(check.flash_forward, attention_cpu.forward_kernel)
    expect_pass(check.flash_forward, flash_numpy)
    expect_pass(check.flash_forward, rows_online_forward)
    expect_failure(check.flash_forward, _stub, match="not implemented yet")


@pytest.mark.parametrize("wrong, match", [
    (lambda *a: flash_numpy(*a, whole=True), "grows with the number of keys"),     # right values, (T, T) memory
    (rows_numpy, "grows with the number of keys"),                                 # right values, no online softmax
    (strip_forward, "grows with the number of keys"),                              # right values, a strip per task
    (lambda *a: flash_numpy(*a, m_start=0.0), "far below zero"),                   # right values near 0
    (lambda *a: flash_numpy(*a, no_skip=True), "reads key tiles"),                 # right values, twice the work
    (all_tiles_forward, "reads key tiles"),                                        # the same, masked by assignment
    (lambda *a: flash_numpy(*a, scores_only=True), "computes scores of tiles"),    # hidden scores, masked, unused
    (rows_scoring_every_key(), "computes scores of tiles"),                        # the same, in a closure's helper
    (lambda *a: flash_numpy(*a, shift=1), "off by one"),
    (lambda *a: flash_numpy(*a, first_keys=True), "LAST Tq of the Tk positions"),
    (lambda *a: flash_numpy(*a, drop_last=True), "must not be dropped"),
    (lambda *a: flash_numpy(*a, no_scale=True), "multiplied by scale"),
    (lambda *a: flash_numpy(*a, lse_is_m=True), "lse is m + log(l)"),
    (lambda *a: flash_numpy(*a, skip_last_rows=True), "never written"),
])
def test_flash_forward_rejects(wrong, match):
    with np.errstate(all="ignore"):
        expect_failure(check.flash_forward, wrong, match=match)


def flash_backward_numpy(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK, use_delta=True, scale_dq=True,
                         zero_dq=True, whole=False, no_skip=False, zero_by_assignment=False, scores_only=False):
    """By key tiles, recomputing P from lse, in numpy; whole=True builds each head's (T, T) P and dS;
    no_skip=True visits the query rows above the diagonal (right values, twice the work),
    zero_by_assignment=True does so the way the course's own kernel masks: P and dS set to 0 where hidden,
    and scores_only=True computes every row's scores and keeps the visible rows' (no hidden value is used)."""
    BH, Tq, _ = q.shape
    Tk = k.shape[1]
    if zero_dq:
        dq[:] = 0
    for h in range(BH):
        D = (do[h] * o[h]).sum(1) if use_delta else np.zeros(Tq)
        tiles = [(0, Tk)] if whole else [(j0, min(j0 + BK, Tk)) for j0 in range(0, Tk, BK)]
        for j0, j1 in tiles:
            skip = causal and not (no_skip or whole or zero_by_assignment)
            r0 = max(0, j0 - (Tk - Tq)) if skip else 0    # rows that see a key of the tile
            qh, doh = q[h, r0:], do[h, r0:]
            hidden = np.arange(j0, j1)[None, :] > np.arange(r0, Tq)[:, None] + Tk - Tq if causal else None
            s = (q[h] @ k[h, j0:j1].T)[r0:] * scale if scores_only else qh @ k[h, j0:j1].T * scale
            if causal and not zero_by_assignment:
                s = np.where(hidden, -np.inf, s)
            p = np.exp(s - lse[h, r0:][:, None])
            if zero_by_assignment and causal:
                p[hidden] = 0
            ds = p * (doh @ v[h, j0:j1].T - D[r0:, None])
            if zero_by_assignment and causal:
                ds[hidden] = 0
            dv[h, j0:j1] = p.T @ doh
            dk[h, j0:j1] = ds.T @ qh * scale
            dq[h, r0:] += ds @ k[h, j0:j1] * (scale if scale_dq else 1)


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def backward_two_passes(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK):
    """Correct, written another way: one pass of (head, query tile) tasks that own their rows of dq, then
    one of (head, key tile) tasks that own their rows of dk and dv; each recomputes P, row by row, and
    walks only the tiles its rows or keys see. No tile product: plain loops."""
    BH, Tq, d = q.shape
    Tk, dvs = k.shape[1], v.shape[2]
    off = Tk - Tq
    nq_tiles, nk_tiles = (Tq + BQ - 1) // BQ, (Tk + BK - 1) // BK
    for task in prange(BH * nq_tiles):
        h, i0 = task // nq_tiles, task % nq_tiles * BQ
        for i in range(i0, min(Tq, i0 + BQ)):
            D = q.dtype.type(0)
            for c in range(dvs):
                D += do[h, i, c] * o[h, i, c]
            for c in range(d):
                dq[h, i, c] = 0
            last = min(Tk, i + off + 1) if causal else Tk
            for j in range(last):
                s = q.dtype.type(0)
                dp = q.dtype.type(0)
                for c in range(d):
                    s += q[h, i, c] * k[h, j, c]
                for c in range(dvs):
                    dp += do[h, i, c] * v[h, j, c]
                ds = math.exp(s * scale - lse[h, i]) * (dp - D)
                for c in range(d):
                    dq[h, i, c] += ds * k[h, j, c] * scale
    for task in prange(BH * nk_tiles):
        h, j0 = task // nk_tiles, task % nk_tiles * BK
        for j in range(j0, min(Tk, j0 + BK)):
            for c in range(d):
                dk[h, j, c] = 0
            for c in range(dvs):
                dv[h, j, c] = 0
            first = max(0, j - off) if causal else 0
            for i in range(first, Tq):
                s = q.dtype.type(0)
                dp = q.dtype.type(0)
                D = q.dtype.type(0)
                for c in range(d):
                    s += q[h, i, c] * k[h, j, c]
                for c in range(dvs):
                    dp += do[h, i, c] * v[h, j, c]
                    D += do[h, i, c] * o[h, i, c]
                p = math.exp(s * scale - lse[h, i])
                for c in range(dvs):
                    dv[h, j, c] += p * do[h, i, c]
                for c in range(d):
                    dk[h, j, c] += p * (dp - D) * q[h, i, c] * scale


def test_flash_backward_accepts_the_course_kernel_and_other_correct_ones():
    expect_pass(check.flash_backward, attention_cpu.backward_kernel)
    expect_pass(check.flash_backward, flash_backward_numpy)
    expect_pass(check.flash_backward, backward_two_passes)
    expect_failure(check.flash_backward, _stub, match="not implemented yet")


@pytest.mark.parametrize("wrong, match", [
    (lambda *a: flash_backward_numpy(*a, whole=True), "grows like T^"),           # right values, (T, T) memory
    (lambda *a: flash_backward_numpy(*a, no_skip=True), "reads tiles that no query sees"),
    (lambda *a: flash_backward_numpy(*a, zero_by_assignment=True), "reads tiles that no query sees"),
    (lambda *a: flash_backward_numpy(*a, scores_only=True), "computes scores of tiles"),
    (lambda *a: flash_backward_numpy(*a, use_delta=False), "D, each row's sum of dO * O"),
    (lambda *a: flash_backward_numpy(*a, scale_dq=False), "dQ lacks the scale"),
    (lambda *a: flash_backward_numpy(*a, zero_dq=False), "starts from 0"),
])
def test_flash_backward_rejects(wrong, match):
    with np.errstate(all="ignore"):
        expect_failure(check.flash_backward, wrong, match=match)


# ---- 5. the CUDA kernel, on the simulator -----------------------------------------------------

def cuda_kernel(sync_after_load=True, sync_after_use=True, idle_threads_load=True, load_row="key", scaled=True,
                key_stop="last"):
    """The forward as a CUDA kernel, with one of its barriers or loads wrong when a flag says so."""

    @cuda.jit
    def kernel(q, k, v, out, lse, scale, causal):
        h, t = cuda.blockIdx.x, cuda.threadIdx.x
        i0 = cuda.blockIdx.y * TILE
        i = i0 + t
        Tq, d, Tk, dv = q.shape[1], q.shape[2], k.shape[1], v.shape[2]
        if not idle_threads_load and i >= Tq:
            return                                  # an idle thread leaves before loading its rows
        k_tile = cuda.shared.array((TILE, D_MAX), float64)
        v_tile = cuda.shared.array((TILE, D_MAX), float64)
        s = cuda.local.array(TILE, float64)
        acc = cuda.local.array(D_MAX, float64)
        for c in range(dv):
            acc[c] = 0.0
        m, den = -math.inf, 0.0
        last_seen = i0 + (TILE - 1 if key_stop == "last" else 0) + Tk - Tq   # the last key the block needs
        k_end = min(Tk, last_seen + 1) if causal else Tk
        for j0 in range(0, k_end, TILE):
            row = j0 + t if load_row == "key" else min(i, Tk - 1)
            if j0 + t < Tk:
                for c in range(d):
                    k_tile[t, c] = k[h, row, c]
                for c in range(dv):
                    v_tile[t, c] = v[h, row, c]
            if sync_after_load:
                cuda.syncthreads()
            if i < Tq:
                n = min(TILE, Tk - j0, i + Tk - Tq + 1 - j0) if causal else min(TILE, Tk - j0)
                m_new = m
                for j in range(n):
                    total = 0.0
                    for c in range(d):
                        total += q[h, i, c] * k_tile[j, c]
                    s[j] = total * (scale if scaled else 1.0)
                    m_new = max(m_new, s[j])
                alpha = math.exp(m - m_new)
                den *= alpha
                for c in range(dv):
                    acc[c] *= alpha
                for j in range(n):
                    p = math.exp(s[j] - m_new)
                    den += p
                    for c in range(dv):
                        acc[c] += p * v_tile[j, c]
                m = m_new
            if sync_after_use:
                cuda.syncthreads()
        if i < Tq:
            for c in range(dv):
                out[h, i, c] = acc[c] / den
            lse[h, i] = m + math.log(den)

    return kernel


@cuda.jit
def cuda_stub(q, k, v, out, lse, scale, causal):
    raise NotImplementedError


def test_flash_forward_cuda_passes_on_the_course_kernel_and_on_a_right_one():
    expect_pass(check.flash_forward_cuda, attention_cuda.kernels(numba.float64)[0], attention_cuda.TILE)
    expect_pass(check.flash_forward_cuda, cuda_kernel(), TILE)
    expect_failure(check.flash_forward_cuda, cuda_stub, TILE, match="not implemented yet")


@pytest.mark.parametrize("mistake, match", [
    (dict(sync_after_load=False), "syncthreads"),          # a race: threads read rows not loaded yet
    (dict(sync_after_use=False), "syncthreads"),           # a race: the next tile overwrites rows in use
    (dict(idle_threads_load=False), "threads past Tq still load"),
    (dict(load_row="query"), None),
    (dict(scaled=False), "multiplied by scale"),
    (dict(key_stop="first"), None),   # right whenever Tk - Tq is a multiple of the tile
])
def test_flash_forward_cuda_rejects(mistake, match):
    expect_failure(check.flash_forward_cuda, cuda_kernel(**mistake), TILE, match=match)


# ---- 6. the custom op --------------------------------------------------------------------------

def register(name, forward_kernel, backward_kernel, contiguous_grads=True, fake=True, backward_op=True,
             lse_differentiable=False):
    """The op around the kernels, with one piece missing or wrong when a flag says so."""
    def heads(t):
        return t.detach().contiguous().reshape(-1, *t.shape[2:]).numpy()

    @torch.library.custom_op(name, mutates_args=())
    def op(q: T, k: T, v: T, causal: bool, scale: float) -> tuple[T, T]:
        out, lse = q.new_empty(*q.shape[:3], v.shape[-1]), q.new_empty(q.shape[:3])
        qn = heads(q)
        forward_kernel(qn, heads(k), heads(v), heads(out), heads(lse), qn.dtype.type(scale), causal, 64, 64)
        return out, lse

    if fake:
        op.register_fake(lambda q, k, v, causal, scale: (q.new_empty(*q.shape[:3], v.shape[-1]), q.new_empty(q.shape[:3])))

    def grads(q: T, k: T, v: T, out: T, dout: T, lse: T, causal: bool, scale: float) -> tuple[T, T, T]:
        dq, dk, dv = ((t.new_empty(t.shape) if contiguous_grads else torch.empty_like(t)) for t in (q, k, v))
        qn = heads(q)
        backward_kernel(qn, heads(k), heads(v), heads(out), heads(dout), heads(lse), heads(dq), heads(dk), heads(dv),
                        qn.dtype.type(scale), causal, 64, 64)
        return dq, dk, dv

    if backward_op:
        grads = torch.library.custom_op(name + "_backward", mutates_args=())(grads)
        grads.register_fake(lambda q, k, v, out, dout, lse, causal, scale: (
            q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)))

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:3], *output)
        if not lse_differentiable:
            ctx.mark_non_differentiable(output[1])
        ctx.causal, ctx.scale = inputs[3:]

    def backward(ctx, dout, _):
        q, k, v, out, lse = ctx.saved_tensors
        return *grads(q, k, v, out, dout, lse, ctx.causal, ctx.scale), None, None

    op.register_autograd(backward, setup_context=setup_context)
    return op


def register_saving_less(name, forward_kernel, backward_kernel):
    """Correct, written another way: the ops take and give (B, H, T, d) tensors permuted to (T, B, H, d)
    storage, other tiles (32 x 16), and the forward saves only q, k, v and lse: the backward op runs the
    forward kernel again for out, which its kernel needs for D."""
    def flat(t):                        # (B, H, T, ...) -> (B*H, T, ...) contiguous numpy
        return t.detach().reshape(-1, *t.shape[2:]).contiguous().numpy()

    def run_forward(q, k, v, causal, scale):
        out = torch.zeros(q.shape[:3] + v.shape[3:], dtype=q.dtype)
        lse = torch.zeros(q.shape[:3], dtype=q.dtype)
        o_np, l_np = out.view(-1, *out.shape[2:]).numpy(), lse.view(-1, lse.shape[2]).numpy()
        forward_kernel(flat(q), flat(k), flat(v), o_np, l_np, o_np.dtype.type(scale), causal, 32, 16)
        return out, lse

    @torch.library.custom_op(name, mutates_args=())
    def forward(q: T, k: T, v: T, causal: bool, scale: float) -> tuple[T, T]:
        return run_forward(q, k, v, causal, scale)

    @forward.register_fake
    def _(q, k, v, causal, scale):
        return q.new_empty(q.shape[:3] + v.shape[3:]), q.new_empty(q.shape[:3])

    @torch.library.custom_op(name + "_backward", mutates_args=())
    def backward_op(q: T, k: T, v: T, dout: T, lse: T, causal: bool, scale: float) -> tuple[T, T, T]:
        out, _ = run_forward(q, k, v, causal, scale)
        grads = [torch.zeros(t.shape, dtype=t.dtype) for t in (q, k, v)]
        views = [g.view(-1, *g.shape[2:]).numpy() for g in grads]
        backward_kernel(flat(q), flat(k), flat(v), flat(out), flat(dout), flat(lse), *views,
                        views[0].dtype.type(scale), causal, 32, 16)
        return grads[0], grads[1], grads[2]

    @backward_op.register_fake
    def _(q, k, v, dout, lse, causal, scale):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], inputs[1], inputs[2], output[1])
        ctx.mark_non_differentiable(output[1])
        ctx.causal, ctx.scale = inputs[3], inputs[4]

    def gradients(ctx, dout, _):
        q, k, v, lse = ctx.saved_tensors
        return *backward_op(q, k, v, dout.contiguous(), lse, ctx.causal, ctx.scale), None, None

    forward.register_autograd(gradients, setup_context=setup_context)
    return forward


def test_attention_op_accepts_the_course_register_and_another_correct_one():
    expect_pass(check.attention_op, attention_op.register)
    expect_pass(check.attention_op, register_saving_less)
    expect_failure(check.attention_op, _stub, match="not implemented yet")


@pytest.mark.parametrize("mistake, match", [
    (dict(contiguous_grads=False), "transposed views"),     # right on contiguous tensors, wrong on the GPT's views
    (dict(fake=False), "opcheck failed"),                   # right eagerly, cannot be traced
    (dict(backward_op=False), "opcheck failed"),            # the backward runs numpy on fake tensors
    (dict(lse_differentiable=True), "non-differentiable"),
])
def test_attention_op_rejects(mistake, match):
    expect_failure(check.attention_op, lambda name, f, b: register(name, f, b, **mistake), match=match)

