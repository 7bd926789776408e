"""Checks for chapter 10, fused kernels: the online-softmax update, the fused selective scan, the
FlashAttention forward and backward in Numba, the forward as a CUDA kernel, and the custom op.

The oracles are written another way: definitions over whole rows (the update), chapter 05's
sequential scan and a numpy loop over every state (the scan), PyTorch's scaled_dot_product_attention
and its autograd (attention), all in float64. Each kernel's outputs arrive filled with NaN, so an
element nobody wrote shows up. And the properties the chapter teaches are checked too, in ways that
do not depend on the machine or its thread count:
- memory: `tracemalloc` sees every array numpy or a Numba kernel allocates, on any thread and any OS. The
  scan's scratch must not grow with L, the forward's must not grow with Tk (at fixed tiles, with one
  query tile, so that the thread count cannot change it), the backward's must not grow like T^2;
- causal tiles left unread: NaN planted in the keys and values (and, for the backward, the queries and
  output gradients) of tiles that no query sees must not reach the rows that cannot see them: any
  arithmetic on a masked entry shows, since 0 * NaN is NaN;
- causal tiles left uncomputed: a kernel that computes a masked score and then replaces it (by a branch or a
  select) leaves no trace in the values. So the kernel also runs as plain Python on inputs where only the
  score of a query and a key that no tile needs overflows, with numpy told to raise on overflow;
- parallel: a kernel compiled with parallel=True has a loop that Numba's own diagnostics say runs in
  parallel (chapter 06's test): a serial range under parallel=True is caught;
- the online softmax's running max: scores far below zero, where any other start than -inf underflows.
"""

import itertools

import numpy as np
import torch
import torch.nn.functional as F

from course_lib.checks import CheckFailed, assert_close, exercise, fmt, require, rng
from course_lib.checks.ch05 import scan_inputs  # chapter 05's random scan inputs, the same here
from course_lib.checks.ch06 import _runs_in_parallel  # chapter 06's test: Numba made a prange loop parallel
from course_lib.checks.plain_python import AsPython, caller_line, your_line
from course_lib.memory import growth, peak_bytes


def _mb(n):
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def _nan(shape, dtype=np.float64):
    return np.full(shape, np.nan, dtype)


def _require_written(out, what, hint):
    """Fail if some element of an output that arrived full of NaN is NaN still: nobody wrote it."""
    bad = np.isnan(np.asarray(out, dtype=np.float64))
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise CheckFailed(f"{what}: {int(bad.sum())} of {bad.size} elements are NaN (first at index {first}); "
                          f"the array arrived full of NaN, so they were never written, or a NaN crept in.\n"
                          f"  hint: {hint}")


# ---- 1. the online-softmax update ------------------------------------------------------------


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


def _update_mistakes(m, l, acc, s, v, m_new, l_new, acc_new):
    """{"l": {hint: l}, "acc": {hint: acc}} of the usual mistakes, from the definitions and the right new state:
    the old part of a sum left where it was, or moved the wrong way, the tile's terms on the wrong max, acc
    divided by l."""
    tile = np.exp(s - m_new[:, None])                      # this tile's terms, on the new max
    stale = "when the max rises, what was summed before still counts as if on the old max: lesson 10, section 5"
    inverted = "the old part of the sum grew when the max rose; it should shrink (lesson 10, section 5's picture)"
    return {"l": {stale: l + tile.sum(1), inverted: l * np.exp(m_new - m) + tile.sum(1),
                  "the tile's own terms are not taken relative to the new max": l_new - tile.sum(1) + np.exp(s).sum(1)},
            "acc": {stale: acc + tile @ v, inverted: acc * np.exp(m_new - m)[:, None] + tile @ v,
                    "acc came out divided by l: acc is a running sum, the division waits for the last tile":
                        acc_new / l_new[:, None]}}


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
            wrong = _update_mistakes(m, l, acc, s, v, m_exp, l_exp, acc_exp)
            assert_close(out[0], m_exp, what="m, the new running max", rtol=1e-12, atol=1e-12, inputs=inputs,
                         mistakes={"the new max forgot the old m: it is the max of every score seen so far":
                                   s.max(1)})
            assert_close(out[1], l_exp, what="l, the new running sum", rtol=1e-9, atol=1e-12, inputs=inputs,
                         mistakes=wrong["l"])
            assert_close(out[2], acc_exp, what="acc, the new running sum of exp(s - m) v", rtol=1e-9, atol=1e-12,
                         inputs=inputs, mistakes=wrong["acc"])
    return "6 tiles: the first one, a rising max, huge and masked scores, 3 random"


# ---- instruments for a kernel run as plain Python (course_lib.checks.plain_python) -------------


class _Allocations:
    """numpy as a kernel run by AsPython sees it, where the functions that make an array note its dtype and
    the kernel's line that asked for it."""

    MAKERS = {"empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like", "full_like", "array"}

    def __init__(self):
        self.made = []

    def __getattr__(self, name):
        make = getattr(np, name)
        if name not in self.MAKERS:
            return make

        def noted(*args, **kwargs):
            out = make(*args, **kwargs)
            self.made.append((np.dtype(out.dtype), out.shape, caller_line()))
            return out
        return noted


# ---- 2. the fused selective scan ---------------------------------------------------------------


def _scan_states(x, delta, A, B, carry=True, exp=True, delta_in_b=True):
    """Every state h_t, (b, L, D, N), in float64, one numpy step per position (the flags build mistakes)."""
    bsz, L, Dm = x.shape
    h, states = np.zeros((bsz, Dm, A.shape[1])), np.empty((bsz, L, Dm, A.shape[1]))
    for t in range(L):
        a = np.exp(delta[:, t, :, None] * A) if exp else delta[:, t, :, None] * A
        u = (delta[:, t] if delta_in_b else 1) * x[:, t]
        h = (a * h if carry else 0) + u[:, :, None] * B[:, t, None, :]
        states[:, t] = h
    return states


def _readout(states, C, x, D, skip=True):
    return np.einsum("bldn,bln->bld", states, C) + (x * D if skip else 0)


def _checkpoints(states, chunk, after=False):
    """The state before every chunk-th step (h = 0 before step 0); after=True: the state after it (a mistake)."""
    L = states.shape[1]
    steps = range(0, L, chunk)
    if after:
        return np.stack([states[:, t] for t in steps], 1)
    return np.stack([states[:, t - 1] if t else np.zeros_like(states[:, 0]) for t in steps], 1)


def _run_scan(kernel, args, chunk, dtype):
    x = args[0]
    (bsz, L, Dm), N = x.shape, args[2].shape[1]
    y, h_last = _nan((bsz, L, Dm), dtype), _nan((bsz, Dm, N), dtype)
    ckpt = _nan((bsz, -(-L // chunk), Dm, N), dtype)
    kernel(*(np.ascontiguousarray(a, dtype=dtype) for a in args), y, h_last, ckpt, chunk)
    return y, h_last, ckpt


@exercise
def fused_scan(your_fused_scan):
    """The fused selective scan kernel: y, the last state and the checkpoints against chapter 05's scan and
    a numpy loop over every state (float64), float32 too; then what it allocates as L grows."""
    from course_lib.mamba.scan import selective_scan_sequential

    cases = [(1, 1, 2, 3, 4), (2, 13, 3, 5, 4), (1, 9, 4, 1, 1), (1, 6, 2, 2, 8)]
    cases.append((2, int(rng().integers(10, 40)), int(rng().integers(2, 7)), int(rng().integers(2, 9)),
                  int(rng().integers(2, 10))))
    for b, L, D, N, chunk in cases:
        args = scan_inputs(b, L, D, N)
        x, delta, A, Bm, Cm, Dk = args
        y, h_last, ckpt = _run_scan(your_fused_scan, args, chunk, np.float64)
        what = f"for (b, L, D, N) = {(b, L, D, N)} and chunk = {chunk}"
        _require_written(y, f"y {what}", "y arrived full of NaN: some (batch, channel) pairs or some steps were "
                         "never written")
        states = _scan_states(x, delta, A, Bm)
        expected = selective_scan_sequential(*(torch.from_numpy(a) for a in args)).numpy()
        assert_close(y, expected, what=f"y {what}", rtol=1e-9, atol=1e-12, inputs={"x": x, "delta": delta, "A": A}, mistakes={
            "the state is not carried from one step to the next: each step starts again from zero":
                _readout(_scan_states(x, delta, A, Bm, carry=False), Cm, x, Dk),
            "the D skip is missing from y": _readout(states, Cm, x, Dk, skip=False),
            "the state decays by delta_t A itself, not by its exponential":
                _readout(_scan_states(x, delta, A, Bm, exp=False), Cm, x, Dk),
            "the input term lacks delta: it is delta_t x_t B_t":
                _readout(_scan_states(x, delta, A, Bm, delta_in_b=False), Cm, x, Dk)})
        _require_written(h_last, f"h_last {what}", "every pair's last state belongs in h_last")
        assert_close(h_last, states[:, -1], what=f"h_last, the state after the last step, {what}", rtol=1e-9, atol=1e-12,
                     mistakes={"h_last is one step behind: it is the state after the last step":
                               states[:, -2] if L > 1 else 0 * h_last})
        _require_written(ckpt, f"ckpt {what}", f"ceil(L / chunk) = {ckpt.shape[1]} checkpoints per pair, the first one "
                         "at step 0")
        assert_close(ckpt, _checkpoints(states, chunk), what=f"ckpt, the state before every chunk-th step, {what}",
                     rtol=1e-9, atol=1e-12, mistakes={
                         "the checkpoints hold the state after their step; the backward restarts a chunk from the "
                         "state before its first step": _checkpoints(states, chunk, after=True)})
    args = scan_inputs(2, 50, 8, 16)
    y, h_last, ckpt = _run_scan(your_fused_scan, args, 16, np.float32)
    require(y.dtype == np.float32, "float32 inputs must give float32 outputs")
    states = _scan_states(*args[:4])
    for got, exp, name in ((y, _readout(states, args[4], args[0], args[5]), "y"), (h_last, states[:, -1], "h_last")):
        scale = np.abs(exp).max()
        assert_close(got / scale, exp / scale, what=f"{name} in float32 (divided by its largest value), (b, L, D, N) = "
                     "(2, 50, 8, 16)", rtol=0, atol=1e-5, hint="float32 work must stay float32, with float32 states")
    Ls = _scan_memory(your_fused_scan)
    float32 = _float32_work(your_fused_scan)
    parallel = _parallel_if_asked(your_fused_scan, "fused_scan")
    return (f"{len(cases)} shapes (L = 1, L not a multiple of the chunk, chunk = 1) in float64, one in float32, "
            f"scratch memory flat from L = {Ls[0]} to {Ls[-1]}{float32}{parallel}")


def _float32_work(kernel):
    """A float32 run makes float32 arrays only: the kernel runs as plain Python on small float32 inputs, with
    numpy's array makers noting each dtype. (A float64 state is N * 8 bytes a task: too few for tracemalloc
    to tell, and its values are more exact, not wrong.)"""
    numpy = _Allocations()
    try:
        _run_scan(AsPython({np: numpy}).function(kernel, top=True), scan_inputs(1, 6, 2, 3), 4, np.float32)
    except Exception:
        return "; the dtype of its scratch not probed (your kernel does not run as plain Python)"
    wide = [(dtype, shape, line) for dtype, shape, line in numpy.made if dtype.kind in "fc" and dtype != np.float32]
    if wide:
        dtype, shape, line = wide[0]
        raise CheckFailed(
            f"in a float32 run your kernel makes a {dtype} array of shape {shape}, at `{line}`: the values come out "
            f"right (more exact, even), but float32 work must stay float32, half the bytes of every state and twice "
            f"the numbers a vector instruction holds.\n  hint: an array made without a dtype is float64; the "
            f"exercise keeps the state in the inputs' own dtype (exercise 2's statement).")
    return "; float32 work made float32 arrays only"


def _least_peak(run, repeats=2):
    """The smallest of a few peaks of run(): other threads' timing can only add to a peak."""
    run()                                                    # compiled already, or compiled here
    return min(peak_bytes(run, warm_up=False) for _ in range(repeats))


def _scan_memory(kernel):
    """What the kernel allocates must not grow with L: one pair needs only its current state."""
    b, D, N, chunk, Ls = 1, 3, 16, 64, (256, 1024, 4096)
    peaks = []
    for L in Ls:
        inputs = tuple(np.ascontiguousarray(a) for a in scan_inputs(b, L, D, N))
        outputs = (_nan((b, L, D)), _nan((b, D, N)), _nan((b, L // chunk, D, N)))
        peaks.append(_least_peak(lambda: kernel(*inputs, *outputs, chunk)))
    per_step = (peaks[-1] - peaks[0]) / (Ls[-1] - Ls[0])
    require(per_step < 4,
            f"what your kernel allocates grows with L: at (b, D, N) = {(b, D, N)}, float64, its peak was "
            f"{', '.join(_mb(p) for p in peaks)} at L = {', '.join(map(str, Ls))}, {per_step:.0f} more bytes per step. "
            f"A history of one pair's states is {N * 8} bytes per step; the outputs are not counted.",
            hint="a pair's recurrence needs only its current state while it runs (lesson 10, section 4): whatever "
                 "grows with L is the history the fused kernel exists to avoid.")
    return Ls


def _parallel_if_asked(kernel, name):
    """A Numba kernel compiled with parallel=True must have a loop that runs in parallel; says so for the pass
    line. Any other answer (a wrapper, numpy) is judged on the rest."""
    if not getattr(kernel, "targetoptions", {}).get("parallel", False):
        return ""
    _runs_in_parallel(kernel, name)
    return ", and a prange loop that runs in parallel"


# ---- 3. and 4. FlashAttention forward and backward in Numba ----------------------------------


def _attention_np(q, k, v, causal, scale, shift=0, first_keys=False, keys=None):
    """(out, lse, P) in float64 numpy, heads first: (BH, T, d). shift, first_keys and keys build mistakes."""
    Tq, Tk = q.shape[1], k.shape[1]
    i, j = np.arange(Tq)[:, None], np.arange(Tk)[None, :]
    allowed = j <= i + (0 if first_keys else Tk - Tq) + shift if causal else np.ones((Tq, Tk), bool)
    if keys is not None:
        allowed = allowed & (j < keys)
    with np.errstate(invalid="ignore"):
        s = np.where(allowed, q @ k.transpose(0, 2, 1) * scale, -np.inf)
        m = s.max(-1, keepdims=True)
        e = np.exp(s - m)
        denom = e.sum(-1, keepdims=True)
        return e / denom @ v, (m + np.log(denom))[..., 0], e / denom


def _sdpa_float64(q, k, v, causal, scale):
    """PyTorch's out and lse, float64, for numpy heads-first inputs: the oracle (another code path)."""
    q, k, v = (torch.from_numpy(np.asarray(a, np.float64)) for a in (q, k, v))
    Tq, Tk = q.shape[1], k.shape[1]
    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq) if causal else torch.ones(Tq, Tk, dtype=torch.bool)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    lse = (q @ k.transpose(1, 2) * scale).masked_fill(~mask, float("-inf")).logsumexp(-1)
    return out.numpy(), lse.numpy()


def _attention_inputs(BH, Tq, Tk, d, dv):
    return (rng().uniform(-1.5, 1.5, (BH, Tq, d)), rng().uniform(-1.5, 1.5, (BH, Tk, d)),
            rng().uniform(-2, 2, (BH, Tk, dv)))


def _attention_cases():
    """(BH, Tq, Tk, d, dv, BQ, BK, causal): tile edges, tiles that do not divide T, BQ != BK, one-row
    tiles, fewer queries than keys (a KV cache) with and without the mask, one query, and 2 random."""
    cases = [(2, 10, 10, 4, 3, 4, 4, True), (3, 9, 9, 5, 4, 3, 2, True), (2, 7, 20, 3, 5, 4, 6, True),
             (1, 1, 13, 4, 2, 1, 5, True), (2, 6, 11, 3, 4, 1, 1, False), (2, 12, 12, 6, 6, 5, 3, False)]
    for _ in range(2):
        BQ, BK = (int(v) for v in rng().integers(2, 9, 2))
        Tq = BQ * int(rng().integers(1, 4)) + int(rng().integers(1, BQ))          # never a multiple of BQ
        cases.append((int(rng().integers(1, 4)), Tq, Tq + int(rng().integers(0, 6)), int(rng().integers(2, 9)),
                      int(rng().integers(1, 8)), BQ, BK, bool(rng().integers(0, 2))))
    return cases


def _case_name(BH, Tq, Tk, d, dv, BQ, BK, causal):
    return f"BH = {BH}, Tq = {Tq}, Tk = {Tk}, d = {d}, dv = {dv}, BQ = {BQ}, BK = {BK}, causal = {causal}"


def _run_forward(kernel, q, k, v, scale, causal, BQ, BK, dtype=np.float64):
    q, k, v = (np.ascontiguousarray(a, dtype=dtype) for a in (q, k, v))
    out, lse = _nan(q.shape[:2] + v.shape[2:], dtype), _nan(q.shape[:2], dtype)
    kernel(q, k, v, out, lse, dtype(scale), causal, BQ, BK)
    return out, lse


def _forward_mistakes(q, k, v, causal, scale, BK):
    """{hint: (out, lse)} of the usual mistakes."""
    Tq, Tk = q.shape[1], k.shape[1]
    mistakes = {"the scores must be multiplied by scale (1 / sqrt(d)) before the softmax":
                    _attention_np(q, k, v, causal, 1.0)[:2],
                "the last key tile is shorter when Tk is not a multiple of BK: it must not be dropped":
                    _attention_np(q, k, v, causal, scale, keys=Tk // BK * BK)[:2]}
    if causal:
        mistakes["query i sees keys 0 .. i + Tk - Tq, itself included: the mask is off by one"] = \
            _attention_np(q, k, v, causal, scale, shift=1)[:2]
        if Tq < Tk:
            hint = ("the Tq queries are the LAST Tq of the Tk positions (a KV cache holds the earlier keys): "
                    "query i sees keys 0 .. i + Tk - Tq, not 0 .. i")
            mistakes[hint] = _attention_np(q, k, v, causal, scale, first_keys=True)[:2]
    elif Tq == Tk:
        mistakes["causal=False: every query sees every key, no mask"] = _attention_np(q, k, v, True, scale)[:2]
    return mistakes


def _far_below_zero(BH=2, Tq=13, Tk=21, d=5, dv=3):
    """Inputs whose scores all lie far below zero (about -950, spread over a few units): the softmax is
    the same as for scores near 0, but exp(score) underflows to 0 in float64."""
    q, k, v = _attention_inputs(BH, Tq, Tk, d, dv)
    scale = d ** -0.5
    q[..., 0], k[..., 0] = -950 / scale, 1.0
    return q, k, v, scale


@exercise
def flash_forward(your_flash_forward):
    """The tiled forward against PyTorch's SDPA (out) and logsumexp (lse) in float64 on tile edges, scores far
    below zero, float32; then its scratch memory as Tk grows, and the causal tiles it leaves unread."""
    cases = _attention_cases()
    for BH, Tq, Tk, d, dv, BQ, BK, causal in cases:
        q, k, v = _attention_inputs(BH, Tq, Tk, d, dv)
        scale = d ** -0.5
        out, lse = _run_forward(your_flash_forward, q, k, v, scale, causal, BQ, BK)
        what = _case_name(BH, Tq, Tk, d, dv, BQ, BK, causal)
        _require_written(out, f"out for {what}", "every query tile writes its rows, the last, shorter one too")
        ref_out, ref_lse = _sdpa_float64(q, k, v, causal, scale)
        mistakes = _forward_mistakes(q, k, v, causal, scale, BK)
        assert_close(out, ref_out, what=f"out for {what}", rtol=1e-9, atol=1e-12, inputs={"q": q, "k": k, "v": v},
                     mistakes={hint: o for hint, (o, _) in mistakes.items()} | {
                         "out came out without the division by each row's softmax denominator":
                             _unnormalized(q, k, v, causal, scale)})
        _require_written(lse, f"lse for {what}", "every row has an lse to write")
        assert_close(lse, ref_lse, what=f"lse, the log of each row's softmax denominator, for {what}", rtol=1e-9,
                     atol=1e-12, mistakes={hint: lse_ for hint, (_, lse_) in mistakes.items()} | {
                         "lse is m + log(l): the running max plus the log of the running sum": _row_max(q, k, v, causal, scale),
                         "lse is m + log(l): you left out the running max m": ref_lse - _row_max(q, k, v, causal, scale)})
    for causal in (True, False):
        q, k, v, scale = _far_below_zero()
        with np.errstate(all="ignore"):
            out, lse = _run_forward(your_flash_forward, q, k, v, scale, causal, 4, 8)
        ref_out, ref_lse = _sdpa_float64(q, k, v, causal, scale)
        if not (np.allclose(out, ref_out, rtol=1e-9, atol=1e-12) and np.allclose(lse, ref_lse, rtol=1e-9, atol=1e-9)):
            bad = np.argwhere(~np.isclose(out, ref_out, rtol=1e-9, atol=1e-12).all(-1))[0]
            raise CheckFailed(
                f"with every score far below zero (about -950; causal = {causal}, BQ = 4, BK = 8) the outputs are "
                f"wrong, while scores near zero gave the right ones: head {bad[0]}, row {bad[1]}: out "
                f"{fmt(out[tuple(bad)])} against {fmt(ref_out[tuple(bad)])}, lse {fmt(lse[tuple(bad)])} against "
                f"{fmt(ref_lse[tuple(bad)])}.\n  hint: exp of these scores underflows to 0 unless each is taken "
                f"relative to a max that is at most the largest score seen: what does your running max start at?")
    q, k, v = _attention_inputs(2, 70, 70, 16, 16)
    out, lse = _run_forward(your_flash_forward, q, k, v, 0.25, True, 32, 16, np.float32)
    require(out.dtype == np.float32 and lse.dtype == np.float32, "float32 inputs give float32 outputs")
    ref_out, ref_lse = _sdpa_float64(q, k, v, True, 0.25)
    assert_close(out, ref_out, what="out in float32, Tq = Tk = 70, BQ = 32, BK = 16", rtol=1e-4, atol=2e-5)
    assert_close(lse, ref_lse, what="lse in float32", rtol=1e-4, atol=2e-5)
    Tks = _forward_scratch(your_flash_forward)
    _causal_skip_forward(your_flash_forward)
    probed = _hidden_scores(your_flash_forward, "forward", lambda q, k, v, BQ, BK: (
        q, k, v, _nan(q.shape[:2] + v.shape[2:]), _nan(q.shape[:2]), 0.5, True, BQ, BK))
    parallel = _parallel_if_asked(your_flash_forward, "flash_forward")
    return (f"{len(cases)} tilings in float64 (one-row tiles, Tq < Tk, tiles that do not divide T), scores far "
            f"below zero, float32; scratch flat from Tk = {Tks[0]} to {Tks[-1]}; NaN in keys and values that a query "
            f"tile cannot see stayed out of its rows{probed}{parallel}")


def _row_max(q, k, v, causal, scale):
    Tq, Tk = q.shape[1], k.shape[1]
    s = q @ k.transpose(0, 2, 1) * scale
    if causal:
        s = np.where(np.arange(Tk)[None, :] <= np.arange(Tq)[:, None] + Tk - Tq, s, -np.inf)
    return s.max(-1)


def _unnormalized(q, k, v, causal, scale):
    """acc itself, sum_j exp(s_ij - m_i) v_j, as if the division by l were forgotten."""
    out, lse, _ = _attention_np(q, k, v, causal, scale)
    return out * np.exp(lse - _row_max(q, k, v, causal, scale))[..., None]


def _forward_scratch(kernel):
    """What the forward allocates must not grow with Tk at fixed tiles: that is what the online softmax buys.
    One head and one query tile (Tq < BQ), so that a kernel with a task per (head, query tile) runs one task
    whatever the threads; a kernel with a task per row runs 13 small ones. The least of two peaks per size."""
    BQ, BK, Tq, d, Tks = 16, 32, 13, 8, (256, 1024, 4096)
    peaks = []
    for Tk in Tks:
        q, k, v = (np.ascontiguousarray(a) for a in _attention_inputs(1, Tq, Tk, d, d))
        out, lse = _nan((1, Tq, d)), _nan((1, Tq))
        peaks.append(max(_least_peak(lambda: kernel(q, k, v, out, lse, 0.3, causal, BQ, BK)) for causal in (True, False)))
    per_key = (peaks[-1] - peaks[0]) / (Tks[-1] - Tks[0])
    require(per_key < 4,
            f"what your forward allocates grows with the number of keys: with one head, Tq = {Tq}, BQ = {BQ}, BK = {BK}, "
            f"d = dv = {d}, float64, its peak was {', '.join(_mb(p) for p in peaks)} at Tk = {', '.join(map(str, Tks))}: "
            f"{per_key:.0f} more bytes per key. A row of scores is 8 bytes a key, a (BQ, Tk) strip of them {8 * BQ}, "
            f"a copy of k or v {8 * d}; the outputs are not counted.",
            hint="the online softmax lets a query tile hold one tile of scores at a time, whatever Tk (lesson 10, "
                 "sections 5 and 7): anything that grows with Tk is the matrix the tiled kernel exists to avoid.")
    return Tks


def _poisoned(T, B):
    """The first key of the last tile of B keys (tiles start at 0, B, 2B, ...)."""
    return (T - 1) // B * B


def _causal_skip_forward(kernel):
    """A causal kernel that visits key tiles above the diagonal gets the right values (those weights are 0)
    but does up to twice the work. Made visible: NaN in the keys and the values of the last key tiles. A row
    whose query tile sees none of them must stay finite; the check leaves one key tile of margin, so any
    alignment of the key tiles passes. Once with Tq == Tk, once with a KV cache (Tq < Tk)."""
    BQ, BK, d = 4, 8, 4
    for BH, Tq, Tk in ((2, 45, 45), (1, 21, 45)):
        q, k, v = _attention_inputs(BH, Tq, Tk, d, d)
        first = _poisoned(Tk, BK)
        k[:, first:], v[:, first:] = np.nan, np.nan
        with np.errstate(invalid="ignore"):
            out, _ = _run_forward(kernel, q, k, v, 0.5, True, BQ, BK)
        offset = Tk - Tq
        rows = np.arange(Tq)
        tile_end = np.minimum(rows // BQ * BQ + BQ, Tq) - 1 + offset   # the last key each row's query tile sees
        clean = rows[tile_end < first - BK]
        bad = np.argwhere(np.isnan(out[:, clean]).any(-1))
        require(bad.size == 0,
                f"your forward reads key tiles that a query tile cannot see: with causal=True, Tq = {Tq}, Tk = {Tk}, "
                f"BQ = {BQ}, BK = {BK} and NaN in the keys and values {first} .. {Tk - 1}, {len(bad)} of the rows "
                f"0 .. {clean[-1]} came out NaN (first: head {bad[0][0] if bad.size else 0}, row "
                f"{bad[0][1] if bad.size else 0}), though their query tiles see no key past {first - BK - 1}. "
                f"Masked weights are 0, so the values can come out right, but 0 * NaN is NaN: the tile was read, "
                f"which at large T is half of all tiles.",
                hint="a key tile that no row of the query tile can see needs no work at all (lesson 10, section 8's "
                     "grid of visited and skipped tiles).")


# ---- tiles that no query sees: a score computed there overflows -----------------------------------


def _meeting_inputs(BH, Tq, Tk, d, dv, BQ, BK):
    """Inputs on which a causal kernel can only compute an overflow where it need not compute at all. The
    queries of the first query tile and the keys that no query tile holding one of them can see carry 1e200
    in feature 0, which every other query and key has at 0. So every score a causal kernel needs is an
    ordinary number, and the score of such a (query, key) pair is 1e400: an overflow in float64, whatever
    the kernel does with it afterwards (a branch, a select or a multiply by 0). The margin (a query tile and
    a key tile) lets any alignment of the tiles pass."""
    q, k, v = _attention_inputs(BH, Tq, Tk, d, dv)
    first = 2 * BQ + BK - 1 + Tk - Tq
    q[..., 0], k[..., 0] = 0.0, 0.0
    q[:, :BQ, 0], k[:, first:, 0] = 1e200, 1e200
    return q, k, v, first


def _hidden_scores(kernel, pass_name, arguments):
    """Runs the kernel as plain Python (AsPython) on _meeting_inputs, turned into its arguments by
    `arguments(q, k, v, BQ, BK)`; refuses it if a product overflows. Returns the pass line's words: what was
    probed, or that the kernel could not run as Python."""
    python = AsPython().function(kernel, top=True)
    for BH, Tq, Tk in ((1, 29, 29), (1, 21, 45)):
        BQ, BK, d = 4, 8, 4
        q, k, v, first = _meeting_inputs(BH, Tq, Tk, d, d, BQ, BK)
        args = arguments(q, k, v, BQ, BK)
        try:
            with np.errstate(over="raise", invalid="ignore", divide="ignore", under="ignore"):
                python(*args)
        except FloatingPointError as e:
            raise CheckFailed(
                f"your {pass_name} computes scores of tiles that no query of the tile can see: with causal=True, Tq = "
                f"{Tq}, Tk = {Tk}, BQ = {BQ}, BK = {BK}, the queries 0 .. {BQ - 1} and the keys {first} .. {Tk - 1} "
                f"carry 1e200 in feature 0 (every other query and key 0 there), so a score is an ordinary number "
                f"unless such a query meets such a key: then it overflows. Run as plain Python, your kernel "
                f"overflowed {your_line(e, 'ch10.py')}. Set to -inf or 0 afterwards, the values come out right, but "
                f"the tile was computed: at large T, half of all tiles.\n  hint: whether a key tile needs any work is "
                f"known from the two tiles' first and last rows, before a single score (lesson 10, section 8's "
                f"grid of visited and skipped tiles); the mask is for the tiles the diagonal cuts.") from None
        except Exception:
            return ("; tiles no query sees not probed for computed scores (your kernel does not run as plain "
                    "Python)")
    return "; no score computed in a tile no query sees"


def _backward_arguments(q, k, v, BQ, BK):
    """The backward's arguments for _hidden_scores: out and lse from numpy, where the masked scores that
    overflow are replaced by -inf before they count."""
    with np.errstate(all="ignore"):
        out, lse, _ = _attention_np(q, k, v, True, 0.5)
    do = rng().uniform(-1, 1, out.shape)
    return (q, k, v, out, do, lse, _nan(q.shape), _nan(k.shape), _nan(v.shape), 0.5, True, BQ, BK)


def _backward_memory(kernel):
    """The backward must not build a (T, T) matrix, not even one head's: the exponent of its peak against T,
    fitted over three sizes with one head, is about 1 for buffers of T rows (D, dQ) and 2 for (T, T)."""
    BQ, BK, d, Ts = 32, 32, 8, (256, 512, 1024)
    peaks = []
    for T in Ts:
        q, k, v = _attention_inputs(1, T, T, d, d)
        do = rng().uniform(-1, 1, q.shape)
        out, lse = _sdpa_float64(q, k, v, True, 0.3)
        args = [np.ascontiguousarray(a) for a in (q, k, v, out, do, lse)]
        grads = [_nan(a.shape) for a in (q, k, v)]
        peaks.append(_least_peak(lambda: kernel(*args, *grads, 0.3, True, BQ, BK)))
    p = growth(Ts, peaks)
    require(p < 1.5,
            f"what your backward allocates grows like T^{p:.1f}: with one head, d = {d}, BQ = BK = {BQ}, float64, "
            f"its peak was {', '.join(_mb(x) for x in peaks)} at T = {', '.join(map(str, Ts))}. One (T, T) matrix is "
            f"{_mb(Ts[-1] ** 2 * 8)} at T = {Ts[-1]}; the outputs are not counted.",
            hint="the backward rebuilds each tile of P from lse when it needs it (lesson 10, section 9): nothing of "
                 "size (T, T) is ever needed at once.")
    return Ts


def _causal_skip_backward(kernel):
    """The backward's tiles above the diagonal, made visible twice: NaN in the keys and values of the last
    key tiles must reach no row of dq whose query tile sees none of them (with a key tile of margin); NaN in
    the queries and output gradients of the first query tiles must reach no row of dk or dv whose key tile
    none of them sees (with a query tile of margin). A kernel that visits such a tile and sets its masked
    entries to 0 gets 0 * NaN = NaN, whichever loop is outside."""
    BQ, BK, d, BH, T = 4, 8, 4, 2, 45
    scale = 0.5
    q, k, v = _attention_inputs(BH, T, T, d, d)
    do = rng().uniform(-1, 1, q.shape)
    out, lse = _sdpa_float64(q, k, v, True, scale)        # from the clean inputs: only the kernel's reads bring NaN
    first = _poisoned(T, BK)
    kn, vn = k.copy(), v.copy()
    kn[:, first:], vn[:, first:] = np.nan, np.nan
    rows = np.arange(T)
    dq, dk, dv = _nan(q.shape), _nan(k.shape), _nan(v.shape)
    with np.errstate(invalid="ignore"):
        kernel(q, kn, vn, out, do, lse, dq, dk, dv, scale, True, BQ, BK)
    clean = rows[np.minimum(rows // BQ * BQ + BQ, T) - 1 < first - BK]
    bad = np.argwhere(np.isnan(dq[:, clean]).any(-1))
    last_q = (T // 4) // BQ * BQ                          # queries 0 .. last_q - 1 get NaN
    qn, don = q.copy(), do.copy()
    qn[:, :last_q], don[:, :last_q] = np.nan, np.nan
    dq2, dk2, dv2 = _nan(q.shape), _nan(k.shape), _nan(v.shape)
    with np.errstate(invalid="ignore"):
        kernel(qn, k, v, out, don, lse, dq2, dk2, dv2, scale, True, BQ, BK)
    keys = rows[rows // BK * BK >= last_q + BQ]            # key tiles that no poisoned query tile sees
    bad_keys = np.argwhere(np.isnan(dk2[:, keys]).any(-1) | np.isnan(dv2[:, keys]).any(-1))
    require(bad.size == 0 and bad_keys.size == 0,
            f"your backward reads tiles that no query sees: with causal=True, Tq = Tk = {T}, BQ = {BQ}, BK = {BK}, "
            + (f"NaN in the keys and values {first} .. {T - 1} reached {len(bad)} rows of dq among 0 .. {clean[-1]}, "
               f"whose query tiles see none of them" if bad.size else
               f"NaN in the queries and output gradients 0 .. {last_q - 1} reached {len(bad_keys)} rows of dk or dv "
               f"among the keys {keys[0]} .. {T - 1}, which none of those queries sees")
            + ". Masked entries are 0, so the values can come out right, but 0 * NaN is NaN: the tile was read.",
            hint="a (query tile, key tile) pair where no query sees any key needs no work in the backward either "
                 "(lesson 10, section 9's picture shows which tiles each gradient reads).")


def _grads_np(q, k, v, do, causal, scale, use_delta=True, scale_dq=True, scale_dk=True, shift=0):
    """(dq, dk, dv) of sum(out * do) in float64, from the formulas (flags build mistakes)."""
    out, _, P = _attention_np(q, k, v, causal, scale, shift=shift)
    dv = P.transpose(0, 2, 1) @ do
    dP = do @ v.transpose(0, 2, 1)
    D = (do * out).sum(-1, keepdims=True) if use_delta else 0
    dS = P * (dP - D)
    return dS @ k * (scale if scale_dq else 1), dS.transpose(0, 2, 1) @ q * (scale if scale_dk else 1), dv


def _sdpa_grads(q, k, v, do, causal, scale):
    """PyTorch's autograd through scaled_dot_product_attention, float64: the oracle."""
    q, k, v = (torch.tensor(np.asarray(a, np.float64), requires_grad=True) for a in (q, k, v))
    Tq, Tk = q.shape[1], k.shape[1]
    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq) if causal else None
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return [g.numpy() for g in torch.autograd.grad(out, (q, k, v), torch.from_numpy(np.asarray(do, np.float64)))]


def _run_backward(kernel, q, k, v, do, scale, causal, BQ, BK, dtype=np.float64):
    out, lse = _sdpa_float64(q, k, v, causal, scale)
    q, k, v, do, out, lse = (np.ascontiguousarray(a, dtype=dtype) for a in (q, k, v, do, out, lse))
    dq, dk, dv = _nan(q.shape, dtype), _nan(k.shape, dtype), _nan(v.shape, dtype)
    kernel(q, k, v, out, do, lse, dq, dk, dv, dtype(scale), causal, BQ, BK)
    return dq, dk, dv


@exercise
def flash_backward(your_flash_backward):
    """dq, dk, dv by recomputation against PyTorch's autograd through SDPA in float64, on tile edges; then
    float32, its memory against T, and the causal tiles it leaves unread."""
    cases = _attention_cases()
    for BH, Tq, Tk, d, dv, BQ, BK, causal in cases:
        q, k, v = _attention_inputs(BH, Tq, Tk, d, dv)
        do = rng().uniform(-1, 1, (BH, Tq, dv))
        scale = d ** -0.5
        grads = _run_backward(your_flash_backward, q, k, v, do, scale, causal, BQ, BK)
        expected = _sdpa_grads(q, k, v, do, causal, scale)
        what = _case_name(BH, Tq, Tk, d, dv, BQ, BK, causal)
        mistakes = [
            ("the rows of dS do not sum to 0: D, each row's sum of dO * O, is missing from dS = P * (dP - D)",
             _grads_np(q, k, v, do, causal, scale, use_delta=False)),
            ("dQ lacks the scale: the scores were q k^T * scale, so scale comes back in dQ",
             _grads_np(q, k, v, do, causal, scale, scale_dq=False)),
            ("dK lacks the scale: the scores were q k^T * scale, so scale comes back in dK",
             _grads_np(q, k, v, do, causal, scale, scale_dk=False))]
        if causal:
            mistakes.append(("the mask is off by one: query i sees keys 0 .. i + Tk - Tq, so P is 0 above that",
                             _grads_np(q, k, v, do, causal, scale, shift=1)))
        for n, name in enumerate(("dq", "dk", "dv")):
            _require_written(grads[n], f"{name} for {what}",
                             "dq, dk and dv arrive full of NaN (as uninitialized memory would be): a gradient you add "
                             "into starts from 0, and every row is written, those of keys no query sees too")
            assert_close(grads[n], expected[n], what=f"{name} for {what}", rtol=1e-9, atol=1e-12,
                         inputs={"q": q, "k": k, "v": v, "do": do},
                         mistakes={hint: m[n] for hint, m in mistakes})
    q, k, v = _attention_inputs(2, 70, 70, 16, 16)
    do = rng().uniform(-1, 1, q.shape)
    grads = _run_backward(your_flash_backward, q, k, v, do, 0.25, True, 32, 16, np.float32)
    for name, g, e in zip(("dq", "dk", "dv"), grads, _sdpa_grads(q, k, v, do, True, 0.25)):
        require(g.dtype == np.float32, "float32 inputs give float32 gradients")
        assert_close(g, e, what=f"{name} in float32, Tq = Tk = 70, BQ = 32, BK = 16", rtol=1e-3, atol=1e-4)
    Ts = _backward_memory(your_flash_backward)
    _causal_skip_backward(your_flash_backward)
    probed = _hidden_scores(your_flash_backward, "backward", _backward_arguments)
    parallel = _parallel_if_asked(your_flash_backward, "flash_backward")
    return (f"{len(cases)} tilings in float64 (one-row tiles, Tq < Tk, tiles that do not divide T), float32; no "
            f"(T, T) matrix from T = {Ts[0]} to {Ts[-1]}; NaN in tiles no query sees stayed out of dq, dk and dv"
            f"{probed}{parallel}")


# ---- 5. the forward as a CUDA kernel ------------------------------------------------------------

RACE_HINT = ("threads read the shared tiles that other threads write: one cuda.syncthreads() after the tile is "
             "loaded (before any thread reads it), and one after the tile is used (before the next loop "
             "overwrites it).")
LOAD_HINT = ("each of the block's TILE threads loads one key row and one value row of the tile, whether or not "
             "it has a query row of its own: in the last block, threads past Tq still load (and still reach "
             "every cuda.syncthreads()); only their reads and writes of q, out and lse are skipped.")


def _run_cuda(kernel, tile, q, k, v, scale, causal):
    from course_lib.cuda.launch import LaunchError, launch

    out, lse = _nan(q.shape[:2] + v.shape[2:]), _nan(q.shape[:2])
    grid = (q.shape[0], -(-q.shape[1] // tile))
    try:
        launch(kernel, grid, tile, q, k, v, out, lse, scale, causal)
    except LaunchError as e:
        raise CheckFailed(f"the launch was refused: {e}") from None
    except IndexError as e:                          # the simulator checks every index
        raise CheckFailed(f"a thread read or wrote outside an array: {e}\n  hint: guard the loads of the last, "
                          f"shorter key tile (j0 + t < Tk) and every use of the query row (i < Tq)") from None
    return out, lse


STAGING_SLACK = 1.5      # reads of k and v per key and block may exceed one row each by half (edge tiles, say)


def _staging(your_kernel, t):
    """The tracer's run of your kernel (course_lib/cuda/trace.py, chapter 07) on one head, 2 blocks of t
    queries and t + 3 keys, not causal, so every block needs every key: CheckFailed on a race, or when the
    block reads k and v from global memory more than about once per key."""
    from course_lib.cuda.trace import KernelTraceError, trace

    Tq, Tk, d, dv = 2 * t, t + 3, 4, 3
    q, k, v = _attention_inputs(1, Tq, Tk, d, dv)
    try:
        tr = trace(your_kernel, (1, 2), t, q=q, k=k, v=v, out=_nan((1, Tq, dv)), lse=_nan((1, Tq)), scale=0.5,
                   causal=False)
    except KernelTraceError as e:
        raise CheckFailed(f"the tracer stopped your kernel: {e}") from None
    races = tr.races()
    if races:
        raise CheckFailed(f"out is right, but the tracer found a race at {len(races)} address(es); the first: "
                          f"{tr.describe_race(races[0])}.\n  hint: {RACE_HINT}")
    reads = {name: tr.accesses(array=name, kind="read") for name in ("k", "v")}
    per_key = (len(reads["k"]) + len(reads["v"])) / (2 * Tk)          # 2 blocks, each needs all Tk keys
    if per_key > STAGING_SLACK * (d + dv):
        counts = {}
        for e in reads["k"] + reads["v"]:
            counts[e.array, e.line] = counts.get((e.array, e.line), 0) + 1
        (array, line), n = max(counts.items(), key=lambda kv: kv[1])
        raise CheckFailed(
            f"out and lse are right, but your kernel reads {per_key:.1f} numbers of k and v from global memory per "
            f"key and block (one head, Tq = {Tq}, Tk = {Tk}, d = {d}, dv = {dv}, TILE = {t}, not causal), where a "
            f"block that brings each key's rows in once reads {d + dv} (its {d} numbers of k and {dv} of v); "
            f"{n} of the reads are by line {line} (`{tr.source_line(line)}`), on {array}.\n  hint: the TILE "
            f"queries of a block share every key; lesson 10, section 10 (staging tiles on a GPU) shows how a "
            f"block brings a tile into shared memory once and lets every thread read it from there.")
    return per_key / (d + dv)


@exercise
def flash_forward_cuda(your_kernel, your_tile):
    """The forward as a CUDA kernel, one block of TILE threads per (head, query tile), against SDPA in
    float64; the query and key counts are not multiples of the tile, so the last block has idle threads;
    the first case runs twice, so a race that changes the answer is caught. Then the property: under
    the tracer, each block reads each key's rows of k and v from global memory about once (staged in
    shared memory for all its queries), and no two threads race."""
    require(isinstance(your_tile, int) and 4 <= your_tile <= 32, f"TILE should be an int from 4 to 32, got {your_tile!r}")
    t = your_tile
    # Tk - Tq = t + 3 in the first case, not a multiple of the tile: a block's last query then sees keys of
    # a later tile than its first query does
    cases = [(2, t + 5, 2 * t + 8, 8, 5, True), (1, t + 3, t + 3, 6, 8, True), (2, 5, t + 5, 3, 7, False)]
    first = None
    for BH, Tq, Tk, d, dv, causal in cases:
        q, k, v = _attention_inputs(BH, Tq, Tk, d, dv)
        scale = d ** -0.5
        out, lse = _run_cuda(your_kernel, t, q, k, v, scale, causal)
        first = first or (q, k, v, scale, causal, out)
        what = f"BH = {BH}, Tq = {Tq}, Tk = {Tk}, d = {d}, dv = {dv}, TILE = {t}, causal = {causal}"
        ref_out, ref_lse = _sdpa_float64(q, k, v, causal, scale)
        try:
            _require_written(out, f"out for {what}", "every thread with a query row (i < Tq) writes its row of out")
            full = Tq // t * t
            good_blocks = np.allclose(out[:, :full], ref_out[:, :full], rtol=1e-9, atol=1e-12)
            assert_close(out, ref_out, what=f"out for {what}", rtol=1e-9, atol=1e-12,
                         hint=LOAD_HINT if good_blocks and full < Tq else None,
                         mistakes={hint: o for hint, (o, _) in _forward_mistakes(q, k, v, causal, scale, t).items()})
            _require_written(lse, f"lse for {what}", "every thread with a query row writes lse[h, i] = m + log(l)")
            assert_close(lse, ref_lse, what=f"lse for {what}", rtol=1e-9, atol=1e-12)
        except CheckFailed as e:
            again, _ = _run_cuda(your_kernel, t, q, k, v, scale, causal)
            if not np.array_equal(np.nan_to_num(again, nan=7.25), np.nan_to_num(out, nan=7.25)):
                raise CheckFailed(f"the same input gave different results on two runs: a race.\n  hint: {RACE_HINT}"
                                  f"\n  first run: {e}") from None
            raise CheckFailed(f"{e}\n  hint: if the arithmetic is right, suspect the shared tiles: a missing "
                              f"barrier can give the same wrong answer twice. {RACE_HINT}") from None
    q, k, v, scale, causal, out = first
    again, _ = _run_cuda(your_kernel, t, q, k, v, scale, causal)
    require(np.array_equal(again, out), f"the first case gave different results on a second run: a race.\n  hint: {RACE_HINT}")
    q, k, v = (a.astype(np.float32) for a in _attention_inputs(1, t + 3, t + 3, 4, 4))
    out32, _ = _run_cuda(your_kernel, t, q, k, v, np.float32(0.5), True)
    assert_close(out32, _sdpa_float64(q, k, v, True, 0.5)[0], what="out for float32 inputs", rtol=1e-5, atol=1e-6)
    staged = _staging(your_kernel, t)
    return (f"{len(cases)} shapes with idle threads in the last block, float32, a rerun for races; the tracer: "
            f"{staged:.2f} reads of each key's k and v rows per block, no race")


# ---- 6. the custom op ----------------------------------------------------------------------------

_names = itertools.count()


def _heads_first(B, H, T, d, dtype=torch.float64):
    """A (B, H, T, d) tensor as the GPT passes it: a transposed view of (B, T, H, d), not contiguous."""
    return torch.tensor(rng().uniform(-1.5, 1.5, (B, T, H, d)), dtype=dtype).transpose(1, 2).requires_grad_()


def _op_case(op, B, H, Tq, Tk, d, causal, what, contiguous=False):
    q, k, v = _heads_first(B, H, Tq, d), _heads_first(B, H, Tk, d), _heads_first(B, H, Tk, d)
    if contiguous:
        q, k, v = (t.detach().contiguous().requires_grad_() for t in (q, k, v))
    dout = torch.tensor(rng().uniform(-1, 1, (B, H, Tq, d)))
    scale = d ** -0.5
    result = op(q, k, v, causal, scale)
    require(isinstance(result, tuple) and len(result) == 2, f"the op returns (out, lse); got {fmt(result)}")
    out, lse = result
    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq) if causal else None
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    assert_close(out, ref, what=f"out for {what}", rtol=1e-9, atol=1e-12)
    require(not lse.requires_grad, "lse is an output for the backward, not something to differentiate: mark it "
            "non-differentiable (ctx.mark_non_differentiable) in setup_context")
    mine, theirs = torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(ref, (q, k, v), dout)
    for name, m, t in zip(("q", "k", "v"), mine, theirs):
        assert_close(m, t, what=f"the gradient of {name} for {what}", rtol=1e-9, atol=1e-12)


@exercise
def attention_op(your_register):
    """register(name, forward_kernel, backward_kernel) -> a custom op (out, lse) = op(q, k, v, causal, scale)
    with a fake and an autograd formula: values and gradients against SDPA (float64) on transposed views,
    float32, and torch.library.opcheck. The kernels registered are the course's, so that this check tests
    the registration alone (the exercises' closing cells register yours)."""
    from course_lib.fused import attention_cpu

    name = f"course_check{next(_names)}_{int(rng().integers(1 << 30))}::flash_attention"
    op = your_register(name, attention_cpu.forward_kernel, attention_cpu.backward_kernel)
    require(isinstance(op, torch._library.custom_ops.CustomOpDef),
            f"register_flash_attention should return what @torch.library.custom_op made, got {op!r}.",
            hint="decorate the forward with @torch.library.custom_op(name, mutates_args=()) and return it.")
    for B, H, Tq, Tk, d, causal in [(2, 2, 21, 21, 8, True), (1, 3, 9, 30, 5, True), (2, 1, 17, 17, 4, False)]:
        what = f"(B, H, Tq, Tk, d) = {(B, H, Tq, Tk, d)}, causal = {causal}, q, k, v transposed views"
        try:
            _op_case(op, B, H, Tq, Tk, d, causal, what)
        except CheckFailed as e:
            try:
                _op_case(op, B, H, Tq, Tk, d, causal, what, contiguous=True)
            except CheckFailed:
                raise e from None
            raise CheckFailed(f"{e}\n  hint: with contiguous q, k, v it works: the GPT hands over transposed views. "
                              "Make each tensor contiguous before taking its numpy view, and allocate the outputs "
                              "contiguous (`torch.empty(q.shape, dtype=q.dtype)`; `empty_like` of a view keeps its "
                              "strides), so the kernel writes into the tensors you return.") from None
    q32 = torch.randn(1, 2, 11, 8)
    out32, lse32 = op(q32, q32, q32, True, 0.3)
    require(out32.dtype == lse32.dtype == torch.float32, "float32 inputs give float32 outputs")
    assert_close(out32, F.scaled_dot_product_attention(q32, q32, q32, is_causal=True, scale=0.3),
                 what="out in float32", rtol=1e-5, atol=1e-6)
    q, k, v = (torch.randn(2, 2, 9, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    try:
        torch.library.opcheck(op, (q, k, v, True, 0.5))
    except Exception as e:
        msg = str(e).split("\n")[0][:400]
        raise CheckFailed(f"torch.library.opcheck failed: {msg}\n  hint: the op needs a fake (register_fake: "
                          "empty outputs of the right shapes and dtype), and its backward must be an op too "
                          "(with its own fake), called from the autograd formula (register_autograd).") from None
    return "3 cases on transposed views (a KV cache among them), float32, and torch.library.opcheck"
