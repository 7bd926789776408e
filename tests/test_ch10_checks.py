"""Chapter 10's checks pass on the reference and reject the usual mistakes."""

import numpy as np
from checking import expect_failure, expect_pass

from course_lib.checks import ch10 as check

# ---- references, written as a learner would ---------------------------------------------


def update(m, l, acc, scores, values, rescale_l=True, rescale_acc=True):
    m_new = np.maximum(m, scores.max(1))
    alpha = np.exp(m - m_new)
    p = np.exp(scores - m_new[:, None])
    l_new = (alpha * l if rescale_l else l) + p.sum(1)
    acc_new = (alpha[:, None] * acc if rescale_acc else acc) + p @ values
    return m_new, l_new, acc_new


def scan_channel(x, delta, A, B, C, D, carry=True, skip=True):
    h, y = np.zeros(A.shape[0]), np.empty(x.shape[0])
    for t in range(x.shape[0]):
        h = (np.exp(delta[t] * A) * h if carry else 0) + delta[t] * x[t] * B[t]
        y[t] = C[t] @ h + (D * x[t] if skip else 0)
    return y


def attention(q, k, v, causal=False, tile=4, shift=0, drop_last=False, scale=True):
    Tq, Tk = q.shape[0], k.shape[0]
    m, l, acc = np.full(Tq, -np.inf), np.zeros(Tq), np.zeros((Tq, v.shape[1]))
    stop = Tk // tile * tile if drop_last else Tk
    for j0 in range(0, stop, tile):
        s = q @ k[j0:j0 + tile].T * (q.shape[1] ** -0.5 if scale else 1.0)
        if causal:
            j = np.arange(j0, min(j0 + tile, Tk))
            s = np.where(j[None, :] <= np.arange(Tq)[:, None] + shift, s, -np.inf)
        m, l, acc = update(m, l, acc, s, v[j0:j0 + tile])
    return acc / l[:, None]


def scan_chunks(x, delta, A, B, C, D, chunk=4):
    """Chunks of 4 steps, the state reset at every chunk: right only for L <= 4."""
    return np.concatenate([scan_channel(x[t:t + chunk], delta[t:t + chunk], A, B[t:t + chunk], C[t:t + chunk], D)
                           for t in range(0, x.shape[0], chunk)])


# ---- the checks pass on the references ----------------------------------------------------

def test_checks_pass_on_references():
    expect_pass(check.online_softmax_update, update)
    expect_pass(check.scan_channel, scan_channel)
    expect_pass(check.tiled_attention, attention)


# ---- and reject wrong ones ---------------------------------------------------------------

def _stub(*args, **kwargs):
    raise NotImplementedError


def test_untouched_stubs_fail():
    for c in (check.online_softmax_update, check.scan_channel, check.tiled_attention):
        expect_failure(c, _stub, match="not implemented yet")


def test_online_softmax_update_rejects():
    expect_failure(check.online_softmax_update, lambda *a: update(*a, rescale_l=False), match="rescale the old sum")
    expect_failure(check.online_softmax_update, lambda *a: update(*a, rescale_acc=False), match="rescale the old accumulator")
    expect_failure(check.online_softmax_update, lambda m, l, acc, s, v: update(np.full_like(m, -np.inf), l, acc, s, v),
                   match="remember the old m")


def test_scan_channel_rejects():
    expect_failure(check.scan_channel, lambda *a: scan_channel(*a, carry=False), match="not carried")
    expect_failure(check.scan_channel, scan_chunks)
    expect_failure(check.scan_channel, lambda *a: scan_channel(*a, skip=False), match="D skip")


def test_tiled_attention_rejects():
    expect_failure(check.tiled_attention, lambda *a, **k: attention(*a, **k, shift=1), match="off by one")
    with np.errstate(invalid="ignore"):      # row 0 sees no key: -inf - -inf
        expect_failure(check.tiled_attention, lambda *a, **k: attention(*a, **k, shift=-1), match="row 0 sees key 0")
    expect_failure(check.tiled_attention, lambda *a, **k: attention(*a, **k, drop_last=True), match="must not be dropped")
    expect_failure(check.tiled_attention, lambda *a, **k: attention(*a, **k, scale=False), match="1 / sqrt(d)")
