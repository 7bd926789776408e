"""Checks for chapter 05, Mamba: discretization, the selective scan, the associative scan, the causal
conv, the block and one recurrent step. The oracles are written here a second way, in float64."""

import math

import numpy as np
import torch
import torch.nn.functional as F

from course_lib.checks import assert_close, exercise, fmt, require, rng


def _t(a):
    return torch.tensor(a, dtype=torch.float64)


def _out(x, what):
    require(x is not None, f"{what}: your code returned None. Did you forget a `return`?")
    return x


# ---- discretization ---------------------------------------------------------------------------

@exercise
def discretize_zoh(your_discretize_zoh):
    """Zero-order hold of a diagonal SSM against the matrix exponential of the full matrices."""
    for _ in range(3):
        N = int(rng().integers(3, 10))
        A, B = -rng().uniform(0.2, 3.0, N), rng().uniform(-2, 2, N)
        delta = float(rng().uniform(0.05, 1.5))
        out = your_discretize_zoh(_t(A), _t(B), delta)
        require(isinstance(out, tuple) and len(out) == 2, f"return a pair (A_bar, B_bar); got {fmt(out)}.")
        dA = torch.diag(_t(A)) * delta
        A_bar = torch.linalg.matrix_exp(dA)                                   # (N, N), diagonal here
        B_bar = torch.linalg.solve(dA, (A_bar - torch.eye(N, dtype=torch.float64)) @ (delta * _t(B)))
        inputs = {"A": A, "B": B, "delta": delta}
        assert_close(out[0], torch.diagonal(A_bar), what="A_bar", rtol=1e-9, atol=1e-12, inputs=inputs,
                     mistakes={"A_bar = exp(delta * A): you forgot the exp": delta * A,
                               "that is Euler's A_bar = 1 + delta * A; zero-order hold takes exp(delta * A)": 1 + delta * A,
                               "multiply A by delta inside the exp": np.exp(A)})
        assert_close(out[1], B_bar, what="B_bar", rtol=1e-9, atol=1e-12, inputs=inputs,
                     mistakes={"that is Euler's B_bar = delta * B; ZOH gives (exp(dA) - 1) / (dA) * delta * B": delta * B,
                               "divide by delta * A, then multiply by delta * B (you dropped a delta)":
                                   (np.exp(delta * A) - 1) / A * B / delta,
                               "the sign is flipped: B_bar = (exp(dA) - 1) / (dA) * delta * B, not (1 - exp(dA)) / ...":
                                   (1 - np.exp(delta * A)) / A * B})
    return "3 random diagonal SSMs"


# ---- the selective scan -----------------------------------------------------------------------

def scan_inputs(b, L, D, N):
    """Random selective-scan inputs (x, delta, A, B, C, D) in float64, shaped as the exercise says."""
    x = rng().uniform(-2, 2, (b, L, D))
    delta = np.log1p(np.exp(rng().uniform(-3, 1, (b, L, D))))                 # softplus: positive
    A = -rng().uniform(0.3, 4, (D, N))
    Bm, Cm = rng().uniform(-1.5, 1.5, (b, L, N)), rng().uniform(-1.5, 1.5, (b, L, N))
    Dk = rng().uniform(-1.5, 1.5, D)
    return x, delta, A, Bm, Cm, Dk


def _scan_oracle(x, delta, A, B, C, D, a_of=None, b_of=None, skip=True):
    """Loop over every position in numpy float64. a_of, b_of replace the step (to build mistakes)."""
    bsz, L, Dm = x.shape
    h = np.zeros((bsz, Dm, A.shape[1]))
    y = np.zeros_like(x)
    for t in range(L):
        a = np.exp(delta[:, t, :, None] * A) if a_of is None else a_of(delta[:, t, :, None], A)
        bb = delta[:, t, :, None] * B[:, t, None, :] * x[:, t, :, None] if b_of is None else b_of(t)
        h = a * h + bb
        y[:, t] = (h * C[:, t, None, :]).sum(-1) + (x[:, t] * D if skip else 0)
    return y


@exercise
def selective_scan(your_selective_scan):
    """The sequential selective scan on random shapes (odd channels, lengths 1 and not powers of two)."""
    for b, L, D, N in [(1, 1, 3, 2), (2, 7, 5, 3), (int(rng().integers(1, 4)), int(rng().integers(9, 30)), 6, 4)]:
        x, delta, A, Bm, Cm, Dk = scan_inputs(b, L, D, N)
        yours = _out(your_selective_scan(*map(_t, (x, delta, A, Bm, Cm, Dk))), "selective_scan")
        mistakes = {
            "the D skip is missing: add D * x to C·h": _scan_oracle(x, delta, A, Bm, Cm, Dk, skip=False),
            "you forgot the exp: the state decays by exp(delta * A), not delta * A":
                _scan_oracle(x, delta, A, Bm, Cm, Dk, a_of=lambda d, A: d * A),
            "that is Euler's 1 + delta * A; Mamba takes exp(delta * A)":
                _scan_oracle(x, delta, A, Bm, Cm, Dk, a_of=lambda d, A: 1 + d * A),
            "multiply A by delta inside the exp": _scan_oracle(x, delta, A, Bm, Cm, Dk, a_of=lambda d, A: np.exp(A) + 0 * d),
            "the input term is delta * B * x; you left out delta":
                _scan_oracle(x, delta, A, Bm, Cm, Dk, b_of=lambda t: Bm[:, t, None, :] * x[:, t, :, None]),
        }
        assert_close(yours, _scan_oracle(x, delta, A, Bm, Cm, Dk), what=f"y for (b, L, D, N) = {(b, L, D, N)}",
                     rtol=1e-7, atol=1e-9, mistakes=mistakes)
    return "3 random shapes, lengths 1 to 29"


# ---- the associative scan ---------------------------------------------------------------------

def _steps(shape):
    return rng().uniform(0.2, 1.0, shape), rng().uniform(-2, 2, shape)


@exercise
def combine(your_combine):
    """The composition of two steps h -> a h + b, and its associativity, on random tensors."""
    shape = (3, int(rng().integers(2, 7)))
    (a1, b1), (a2, b2), (a3, b3) = _steps(shape), _steps(shape), _steps(shape)
    out = your_combine((_t(a1), _t(b1)), (_t(a2), _t(b2)))
    require(isinstance(out, tuple) and len(out) == 2, f"return a pair (a, b); got {fmt(out)}.")
    h = rng().uniform(-2, 2, shape)
    inputs = {"left (a, b)": (a1, b1), "right (a, b)": (a2, b2)}
    assert_close(out[0], a1 * a2, what="a of the combined step", inputs=inputs,
                 mistakes={"the factors multiply: a = a_left * a_right": a1 + a2})
    assert_close(out[1], a2 * b1 + b2, what="b of the combined step", inputs=inputs,
                 mistakes={"order matters: left runs first, so right's a scales left's b (a_r * b_l + b_r)": a1 * b2 + b1,
                           "right's a must scale left's b: a_r * b_l + b_r": b1 + b2})
    a, b = your_combine((_t(a1), _t(b1)), (_t(a2), _t(b2)))
    assert_close(a * _t(h) + b, a2 * (a1 * h + b1) + b2, what="the combined step applied to a random h")
    l = your_combine(your_combine((_t(a1), _t(b1)), (_t(a2), _t(b2))), (_t(a3), _t(b3)))
    r = your_combine((_t(a1), _t(b1)), your_combine((_t(a2), _t(b2)), (_t(a3), _t(b3))))
    assert_close(l[1], r[1], what="(s1 + s2) + s3 against s1 + (s2 + s3): it must be associative")
    return "random steps, the composition and associativity"


def _loop_scan(a, b):
    h, out = np.zeros_like(b[:, 0]), np.zeros_like(b)
    for t in range(a.shape[1]):
        h = a[:, t] * h + b[:, t]
        out[:, t] = h
    return out


@exercise
def parallel_scan(your_parallel_scan, your_combine):
    """An inclusive scan along dim 1 in O(log L) rounds: each round one vectorized call of `combine`."""
    for L in [1, 2, 5, int(rng().integers(17, 40)), 100]:
        a, b = _steps((2, L, 3))
        calls = []

        def counted(left, right):
            calls.append(1)
            return your_combine(left, right)

        yours = _out(your_parallel_scan(_t(a), _t(b), counted), "parallel_scan")
        expected = _loop_scan(a, b)
        excl = np.concatenate([np.zeros_like(b[:, :1]), expected[:, :-1]], 1)
        before = np.concatenate([np.ones_like(a[:, :1]), np.cumprod(a, 1)[:, :-1]], 1)
        reversed_ = np.cumsum(before * b, 1)        # what combine(later, earlier) composes to
        assert_close(yours, expected, what=f"the states h for L = {L}", rtol=1e-9, atol=1e-12,
                     inputs={"a": a, "b": b},
                     mistakes={"that is the exclusive scan (shifted by one); include step t in h_t": excl,
                               "you combined (later, earlier): pass the earlier step as `left`": reversed_})
        rounds = 2 * math.ceil(math.log2(L)) + 2 if L > 1 else 2
        require(len(calls) <= rounds,
                f"for L = {L} your scan called `combine` {len(calls)} times; a log-depth scan needs at most "
                f"{rounds} calls, each on whole slices of the sequence.",
                hint="a round is one call of combine on whole slices; the offset doubles from round to round.")
    return "5 lengths, 1 to 100, with a log-depth number of combine calls"


# ---- the causal conv --------------------------------------------------------------------------

def _conv_oracle(x, w, bias):
    Bsz, D, L = x.shape
    K = w.shape[1]
    out = np.zeros_like(x) + bias[None, :, None]
    for t in range(L):
        for j in range(K):            # w[:, K-1] multiplies the current input, w[:, 0] the oldest
            if t - (K - 1 - j) >= 0:
                out[:, :, t] += w[None, :, j] * x[:, :, t - (K - 1 - j)]
    return out


@exercise
def causal_conv1d(your_causal_conv1d):
    """Depthwise causal conv1d with left padding, against a loop; and no output may see the future."""
    for Bsz, D, L, K in [(1, 3, 2, 4), (2, 5, 11, 4), (2, 7, int(rng().integers(5, 20)), 3)]:
        x, w, bias = rng().uniform(-2, 2, (Bsz, D, L)), rng().uniform(-1, 1, (D, K)), rng().uniform(-1, 1, D)
        yours = _out(your_causal_conv1d(_t(x), _t(w), _t(bias)), "causal_conv1d")
        sym = F.conv1d(_t(x), _t(w)[:, None], _t(bias), padding=(K - 1) // 2, groups=D)
        right = F.conv1d(F.pad(_t(x), (0, K - 1)), _t(w)[:, None], _t(bias), groups=D)
        flipped = _conv_oracle(x, w[:, ::-1], bias)
        assert_close(yours, _conv_oracle(x, w, bias), what=f"the conv output for (B, D, L, K) = {(Bsz, D, L, K)}",
                     inputs={"x": x, "weight": w},
                     mistakes={"this conv leaks the future: pad K-1 zeros on the LEFT only": right,
                               "symmetric padding lets position t see later inputs; pad K-1 on the left": sym,
                               "the kernel is reversed: weight[:, K-1] multiplies the current input": flipped})
        t = int(rng().integers(0, L))
        x2 = x.copy()
        x2[:, :, t] += 1.0
        after = your_causal_conv1d(_t(x2), _t(w), _t(bias))
        assert_close(np.asarray(after)[:, :, :t], np.asarray(yours)[:, :, :t],
                     what=f"outputs before position {t} after changing the input at {t}",
                     hint="an output may depend only on inputs at its own position or earlier.")
    return "3 random shapes, and no leak from the future"


# ---- the block --------------------------------------------------------------------------------

def _random_block():
    from course_lib.mamba import MambaBlock, MambaConfig

    torch.manual_seed(int(rng().integers(1 << 30)))
    d_model = int(rng().integers(5, 12))
    block = MambaBlock(MambaConfig(d_model=d_model, d_state=int(rng().integers(2, 6)), d_conv=3,
                                   dt_rank=2)).double()
    with torch.no_grad():
        for name, p in block.named_parameters():
            p.copy_(_t(rng().uniform(-0.6, 0.6, tuple(p.shape))))
    return block


def _block_oracle(blk, u, softplus_at="dt_proj", gate=True, conv=True, **scan_mistake):
    """The block in float64, written with a Hugging Face style conv (pad both, cut the end) and a loop."""
    with torch.no_grad():
        W = {k: v for k, v in blk.named_parameters()}
        D, K = W["D"].shape[0], W["conv1d.weight"].shape[-1]
        N = W["A_log"].shape[1]
        R = W["dt_proj.weight"].shape[1]
        xz = u @ W["in_proj.weight"].T
        x, z = xz[..., :D], xz[..., D:]
        if conv:
            x = F.conv1d(x.transpose(1, 2), W["conv1d.weight"], W["conv1d.bias"], padding=K - 1, groups=D)
            x = x[..., :u.shape[1]].transpose(1, 2)
        x = F.silu(x)
        p = x @ W["x_proj.weight"].T
        dt, Bm, Cm = p[..., :R], p[..., R:R + N], p[..., R + N:]
        if softplus_at == "dt":
            delta = F.softplus(dt) @ W["dt_proj.weight"].T + W["dt_proj.bias"]
        elif softplus_at == "none":
            delta = dt @ W["dt_proj.weight"].T + W["dt_proj.bias"]
        else:
            delta = F.softplus(dt @ W["dt_proj.weight"].T + W["dt_proj.bias"])
        A = -torch.exp(W["A_log"])
        y = torch.from_numpy(_scan_oracle(x.numpy(), delta.numpy(), A.numpy(), Bm.numpy(), Cm.numpy(), W["D"].numpy(),
                                       **scan_mistake))
        if gate:
            y = y * F.silu(z)
        return y @ W["out_proj.weight"].T


@exercise
def block_forward(your_block_forward):
    """The Mamba block forward on a random block (float64), against an oracle written another way."""
    for _ in range(2):
        blk = _random_block()
        u = _t(rng().uniform(-1.5, 1.5, (2, int(rng().integers(5, 14)), blk.config.d_model)))
        yours = _out(your_block_forward(blk, u), "block_forward")
        assert_close(yours, _block_oracle(blk, u), what="the block output", rtol=1e-7, atol=1e-9,
                     mistakes={"the softplus acts on what dt_proj makes, not on what it reads":
                                   _block_oracle(blk, u, softplus_at="dt"),
                               "delta must be positive: dt_proj's output goes through a softplus":
                                   _block_oracle(blk, u, softplus_at="none"),
                               "the gate is missing: the scan's output is gated by silu(z) before out_proj":
                                   _block_oracle(blk, u, gate=False),
                               "the causal conv1d (then SiLU) comes before x_proj":
                                   _block_oracle(blk, u, conv=False)})
    return "2 random blocks"


@exercise
def mamba_step(your_mamba_step):
    """One recurrent step, run over a whole sequence from a zero state, against the full-sequence block."""
    blk = _random_block()
    L, Bsz = int(rng().integers(6, 15)), 2
    u = _t(rng().uniform(-1.5, 1.5, (Bsz, L, blk.config.d_model)))
    D, K, N = blk.config.d_inner, blk.config.d_conv, blk.config.d_state
    conv_state, ssm_state = torch.zeros(Bsz, D, K - 1, dtype=torch.float64), torch.zeros(Bsz, D, N, dtype=torch.float64)
    outs = []
    for t in range(L):
        out = your_mamba_step(blk, u[:, t], conv_state, ssm_state)
        require(isinstance(out, tuple) and len(out) == 3,
                f"return (output, conv_state, ssm_state); got {fmt(out)}.")
        y, conv_state, ssm_state = out
        require(tuple(conv_state.shape) == (Bsz, D, K - 1) and tuple(ssm_state.shape) == (Bsz, D, N),
                f"the states must keep fixed shapes (B, D, K-1) = {(Bsz, D, K - 1)} and (B, D, N) = {(Bsz, D, N)}; "
                f"after step {t} yours are {tuple(conv_state.shape)} and {tuple(ssm_state.shape)}.",
                hint="drop the oldest conv input as you append the newest.")
        outs.append(y)
    expected = _block_oracle(blk, u)
    yours = torch.stack([torch.as_tensor(o) for o in outs], 1)
    assert_close(yours, expected, what="step-by-step outputs against the full sequence", rtol=1e-7, atol=1e-9,
                 mistakes={"the D skip is missing from the step: y = C·h + D * x": _block_oracle(blk, u, skip=False),
                           "you forgot the exp: the state decays by exp(delta * A)":
                               _block_oracle(blk, u, a_of=lambda d, A: d * A),
                           "the conv sees only the current input: the conv state carries the inputs before it":
                               _conv_only_now(blk, u)})
    return "a random block, step by step over a sequence"


def _conv_only_now(blk, u):
    """The block with a conv state that never fills (every step sees zeros for the past)."""
    with torch.no_grad():
        w = blk.conv1d.weight.clone()
        blk.conv1d.weight[:, :, :-1] = 0
        out = _block_oracle(blk, u)
        blk.conv1d.weight.copy_(w)
    return out
