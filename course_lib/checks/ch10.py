"""Checks for chapter 10, fused kernels: the online-softmax update, the fused scan's inner loop for one
channel, and tiled attention. The oracles are written another way: from the definitions (whole rows at
once), chapter 05's sequential scan and PyTorch's scaled_dot_product_attention, all in float64."""

import numpy as np
import torch
import torch.nn.functional as F

from course_lib.checks import assert_close, exercise, fmt, require, rng
from course_lib.checks.ch05 import scan_inputs  # chapter 05's random scan inputs, the same here

# ---- the online-softmax update ------------------------------------------------------------


def _state_of(scores, values):
    """(m, l, acc) by definition, for all the scores seen so far at once: m = max, l = sum exp(s - m),
    acc = sum exp(s - m) v. With no score seen (0 columns): (-inf, 0, 0)."""
    n = scores.shape[0]
    if scores.shape[1] == 0:
        return np.full(n, -np.inf), np.zeros(n), np.zeros((n, values.shape[1]))
    m = scores.max(1)
    p = np.exp(scores - m[:, None])
    return m, p.sum(1), p @ values


def _update_cases():
    """(seen scores, seen values, new scores, new values) per case: fixed adversarial ones, then random."""
    cases = []
    n, dv = 5, 3
    # 1. the first tile: nothing seen yet (m = -inf, l = 0, acc = 0)
    cases.append((np.zeros((n, 0)), np.zeros((0, dv)), rng().uniform(-3, 3, (n, 4)), rng().uniform(-2, 2, (4, dv))))
    # 2. the new tile raises the max of rows 0, 2, 4 by a lot, and lowers nothing in rows 1, 3
    old, new = rng().uniform(-2, 2, (n, 6)), rng().uniform(-2, 2, (n, 3))
    new[0::2] += 5.0
    new[1::2] -= 6.0
    cases.append((old, rng().uniform(-2, 2, (6, dv)), new, rng().uniform(-2, 2, (3, dv))))
    # 3. big scores (exp of them overflows) and a row whose new tile is fully masked (-inf)
    old, new = rng().uniform(700, 800, (n, 5)), rng().uniform(700, 820, (n, 3))
    new[1] = -np.inf
    new[3, 1:] = -np.inf
    cases.append((old, rng().uniform(-2, 2, (5, dv)), new, rng().uniform(-2, 2, (3, dv))))
    for _ in range(3):
        n, k_old, k, dv = (int(v) for v in rng().integers(1, 9, 4))
        cases.append((rng().uniform(-4, 4, (n, k_old)), rng().uniform(-2, 2, (k_old, dv)),
                      rng().uniform(-4, 4, (n, k)), rng().uniform(-2, 2, (k, dv))))
    return cases


@exercise
def online_softmax_update(your_online_softmax_update):
    """One tile of the online softmax: the updated (m, l, acc) against the definitions over all scores seen."""
    for old_s, old_v, s, v in _update_cases():
        m, l, acc = _state_of(old_s, old_v)
        out = your_online_softmax_update(m.copy(), l.copy(), acc.copy(), s.copy(), v.copy())
        require(isinstance(out, tuple) and len(out) == 3, f"return the triple (m, l, acc); got {fmt(out)}.")
        m_exp, l_exp, acc_exp = _state_of(np.concatenate([old_s, s], 1), np.concatenate([old_v, v], 0))
        inputs = {"m": m, "l": l, "acc": acc, "scores": s, "values": v}
        with np.errstate(all="ignore"):
            m_tile = s.max(1)
            alpha = np.exp(m - m_exp)
            p = np.exp(s - m_exp[:, None])
            assert_close(out[0], m_exp, what="m, the new running max", rtol=1e-12, atol=1e-12, inputs=inputs,
                         mistakes={"the running max must also remember the old m: max(m, max of the tile)": m_tile})
            assert_close(out[1], l_exp, what="l, the new running sum", rtol=1e-9, atol=1e-12, inputs=inputs,
                         mistakes={"rescale the old sum: l was taken relative to the old max, multiply it by "
                                   "exp(m_old - m_new) before adding the tile": l + p.sum(1),
                                   "the factor is exp(m_old - m_new), not exp(m_new - m_old)": l / alpha + p.sum(1),
                                   "subtract the new max inside the exp: exp(scores - m_new)": alpha * l + np.exp(s).sum(1)})
            assert_close(out[2], acc_exp, what="acc, the new running sum of exp(s - m) v", rtol=1e-9, atol=1e-12,
                         inputs=inputs,
                         mistakes={"rescale the old accumulator too: multiply acc by exp(m_old - m_new)": acc + p @ v,
                                   "acc keeps the sum, not the average: do not divide by l inside the update":
                                       (alpha[:, None] * acc + p @ v) / l_exp[:, None],
                                   "the factor is exp(m_old - m_new), not exp(m_new - m_old)": acc / alpha[:, None] + p @ v})
    return "6 tiles: the first one, a rising max, huge and masked scores, 3 random"


# ---- the fused scan's inner loop -----------------------------------------------------------

def _channel_mistake(x, delta, A, B, C, D, carry=True, skip=True, exp=True, delta_in_b=True):
    h, y = np.zeros(A.shape[0]), np.zeros(x.shape[0])
    for t in range(x.shape[0]):
        a = np.exp(delta[t] * A) if exp else delta[t] * A
        h = (a * h if carry else 0) + (delta[t] if delta_in_b else 1) * x[t] * B[t]
        y[t] = C[t] @ h + (D * x[t] if skip else 0)
    return y


@exercise
def scan_channel(your_scan_channel):
    """One (batch, channel) pair's fused forward over time, for every pair, against chapter 05's
    sequential scan on the whole (b, L, D, N) problem in float64."""
    from course_lib.mamba.scan import selective_scan_sequential

    for b, L, D, N in [(1, 1, 2, 3), (1, 9, 3, 1), (2, int(rng().integers(10, 30)), 3, int(rng().integers(2, 7)))]:
        x, delta, A, Bm, Cm, Dk = scan_inputs(b, L, D, N)
        expected = selective_scan_sequential(*(torch.tensor(a, dtype=torch.float64) for a in (x, delta, A, Bm, Cm, Dk)))
        expected = expected.numpy()
        for i in range(b):
            for d in range(D):
                args = (x[i, :, d], delta[i, :, d], A[d], Bm[i], Cm[i], float(Dk[d]))
                yours = your_scan_channel(*(a.copy() if isinstance(a, np.ndarray) else a for a in args))
                require(yours is not None, "scan_channel returned None. Did you forget a `return`?")
                mistakes = {
                    "the state is not carried from step to step: h_t = exp(delta_t A) h_(t-1) + ..., "
                    "with h kept between steps": _channel_mistake(*args, carry=False),
                    "the D skip is missing: y_t = C_t . h_t + D x_t": _channel_mistake(*args, skip=False),
                    "you forgot the exp: the state decays by exp(delta_t A)": _channel_mistake(*args, exp=False),
                    "the input term is delta_t B_t x_t; you left out delta": _channel_mistake(*args, delta_in_b=False),
                }
                assert_close(yours, expected[i, :, d], what=f"y of batch row {i}, channel {d}, for (b, L, D, N) = "
                             f"{(b, L, D, N)}", rtol=1e-9, atol=1e-12, mistakes=mistakes,
                             inputs={"x": args[0], "delta": args[1], "A": args[2]})
    return "every channel of 3 random problems, L = 1 to 29"


# ---- tiled attention -----------------------------------------------------------------------

def _sdpa(q, k, v, causal, keys=None):
    """F.scaled_dot_product_attention in float64 on one head; keys: keep only the first `keys` keys."""
    q, k, v = (torch.tensor(a, dtype=torch.float64)[None] for a in (q, k, v))
    Tq, Tk = q.shape[1], k.shape[1]
    mask = torch.ones(Tq, Tk, dtype=torch.bool)
    if causal:
        mask = mask.tril()
    if keys is not None:
        mask[:, keys:] = False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[0].numpy()


def _masked(q, k, v, mask, scale):
    s = np.where(mask, q @ k.T * scale, -np.inf)
    with np.errstate(all="ignore"):
        p = np.exp(s - s.max(1, keepdims=True))
        return p / p.sum(1, keepdims=True) @ v


@exercise
def tiled_attention(your_tiled_attention):
    """Tiled attention with the online softmax against PyTorch's SDPA (float64), causal and not,
    with sequence lengths that are not multiples of the tile."""
    cases = [(10, 10, 4, True), (9, 9, 8, True), (5, 11, 3, False)]
    for _ in range(2):
        tile = int(rng().integers(2, 7))
        T = tile * int(rng().integers(2, 5)) + int(rng().integers(1, tile))     # never a multiple of the tile
        cases.append((T, T, tile, bool(rng().integers(0, 2))))
    for Tq, Tk, tile, causal in cases:
        d, dv = int(rng().integers(2, 9)), int(rng().integers(1, 6))
        q, k, v = rng().uniform(-1.5, 1.5, (Tq, d)), rng().uniform(-1.5, 1.5, (Tk, d)), rng().uniform(-2, 2, (Tk, dv))
        yours = your_tiled_attention(q.copy(), k.copy(), v.copy(), causal=causal, tile=tile)
        require(yours is not None, "tiled_attention returned None. Did you forget a `return`?")
        what = f"the output for Tq = {Tq}, Tk = {Tk}, tile = {tile}, causal = {causal}"
        rows, cols = np.arange(Tq)[:, None], np.arange(Tk)[None, :]
        if causal and not np.isfinite(np.asarray(yours, dtype=np.float64)).all():
            require(False, f"{what} has nan or inf; row 0: {fmt(np.asarray(yours)[0])}",
                    hint="with causal=True query i sees keys 0 .. i, itself included: row 0 sees key 0.")
        full = Tk // tile * tile
        mistakes = {"the scores must be scaled by 1 / sqrt(d)": _masked(q, k, v, cols <= rows if causal else cols >= 0, 1.0),
                    "the last tile is shorter when T is not a multiple of the tile: it must not be dropped":
                        _sdpa(q, k, v, causal, keys=full)}
        if causal:
            mistakes["query i sees keys 0 .. i, not i + 1: the mask is off by one"] = \
                _masked(q, k, v, cols <= rows + 1, d ** -0.5)
        elif Tq == Tk:
            mistakes["causal=False: every query sees every key, no mask"] = _sdpa(q, k, v, True)
        assert_close(yours, _sdpa(q, k, v, causal), what=what, rtol=1e-9, atol=1e-12, mistakes=mistakes,
                     inputs={"q": q, "k": k, "v": v})
    return "5 cases, causal and not, lengths not multiples of the tile"
