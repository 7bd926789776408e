"""Chapter 05's checks pass on the reference and reject the usual mistakes."""

import torch
import torch.nn.functional as F
from checking import expect_failure

from course_lib.checks import ch05 as check
from course_lib.mamba import causal_conv1d as ref_conv
from course_lib.mamba import combine as ref_combine
from course_lib.mamba.scan import selective_scan_sequential
from course_lib.mamba.ssm import discretize_euler, discretize_zoh

# ---- references, written as a learner would ---------------------------------------------

def parallel_scan(a, b, combine):
    L, step = a.shape[1], 1
    while step < L:
        na, nb = combine((a[:, :-step], b[:, :-step]), (a[:, step:], b[:, step:]))
        a, b = torch.cat([a[:, :step], na], 1), torch.cat([b[:, :step], nb], 1)
        step *= 2
    return b


def block_forward(blk, u, softplus_first=False, gate=True, leak=False):
    D, K = blk.config.d_inner, blk.config.d_conv
    x, z = blk.in_proj(u).chunk(2, dim=-1)
    xt = x.transpose(1, 2)
    pad = (0, K - 1) if leak else (K - 1, 0)
    x = F.silu(F.conv1d(F.pad(xt, pad), blk.conv1d.weight, blk.conv1d.bias, groups=D)).transpose(1, 2)
    dt, B, C = blk.x_proj(x).split([blk.config.dt_rank, blk.config.d_state, blk.config.d_state], -1)
    delta = blk.dt_proj(F.softplus(dt)) if softplus_first else F.softplus(blk.dt_proj(dt))
    y = selective_scan_sequential(x, delta, -torch.exp(blk.A_log), B, C, blk.D)
    return blk.out_proj(y * F.silu(z) if gate else y)


def mamba_step(blk, u, conv_state, ssm_state, skip=True, shift=True, exp=True, grow=False):
    x, z = blk.in_proj(u).chunk(2, dim=-1)
    window = torch.cat([conv_state, x[:, :, None]], -1)
    conv_state = window if grow else window[:, :, 1:] if shift else conv_state
    x = F.silu((window * blk.conv1d.weight[:, 0]).sum(-1) + blk.conv1d.bias)
    dt, B, C = blk.x_proj(x).split([blk.config.dt_rank, blk.config.d_state, blk.config.d_state], -1)
    delta = F.softplus(blk.dt_proj(dt))
    dA = delta[..., None] * -torch.exp(blk.A_log)
    h = (torch.exp(dA) if exp else dA) * ssm_state + delta[..., None] * B[:, None] * x[..., None]
    y = (h * C[:, None]).sum(-1) + (blk.D * x if skip else 0)
    return blk.out_proj(y * F.silu(z)), conv_state, h


# ---- the checks pass on the references ----------------------------------------------------

def test_checks_pass_on_references():
    check.discretize_zoh(discretize_zoh)
    check.selective_scan(selective_scan_sequential)
    check.combine(ref_combine)
    check.parallel_scan(parallel_scan, ref_combine)
    check.causal_conv1d(ref_conv)
    check.block_forward(block_forward)
    check.mamba_step(mamba_step)


# ---- and reject wrong ones ---------------------------------------------------------------

def test_discretize_zoh_rejects():
    expect_failure(check.discretize_zoh, discretize_euler, match="Euler")
    expect_failure(check.discretize_zoh, lambda A, B, d: (d * A, discretize_zoh(A, B, d)[1]), match="forgot the exp")
    expect_failure(check.discretize_zoh, lambda A, B, d: (torch.exp(d * A), d * B), match="Euler's B_bar")


def _scan(skip=True, exp=True, delta_in_b=True):
    def scan(x, delta, A, B, C, D):
        h, ys = torch.zeros(x.shape[0], x.shape[2], A.shape[1], dtype=x.dtype), []
        for t in range(x.shape[1]):
            dA = delta[:, t, :, None] * A
            bx = B[:, t, None, :] * x[:, t, :, None] * (delta[:, t, :, None] if delta_in_b else 1)
            h = (torch.exp(dA) if exp else dA) * h + bx
            ys.append((h * C[:, t, None, :]).sum(-1) + (x[:, t] * D if skip else 0))
        return torch.stack(ys, 1)
    return scan


def test_selective_scan_rejects():
    expect_failure(check.selective_scan, _scan(skip=False), match="D skip")
    expect_failure(check.selective_scan, _scan(exp=False), match="forgot the exp")
    expect_failure(check.selective_scan, _scan(delta_in_b=False), match="left out delta")
    expect_failure(check.selective_scan, lambda *args: None, match="None")


def test_combine_rejects():
    expect_failure(check.combine, lambda l, r: (l[0] * r[0], l[0] * r[1] + l[1]), match="order matters")
    expect_failure(check.combine, lambda l, r: (l[0] + r[0], r[0] * l[1] + r[1]), match="multiply")
    expect_failure(check.combine, lambda l, r: (l[0] * r[0], l[1] + r[1]), match="scale left's b")


def test_parallel_scan_rejects():
    def sequential(a, b, combine):         # right values, but L calls: not log depth
        acc, out = (a[:, 0], b[:, 0]), [b[:, 0]]
        for t in range(1, a.shape[1]):
            acc = combine(acc, (a[:, t], b[:, t]))
            out.append(acc[1])
        return torch.stack(out, 1)

    def exclusive(a, b, combine):
        h = parallel_scan(a, b, combine)
        return torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)

    def swapped(a, b, combine):
        return parallel_scan(a, b, lambda l, r: combine(r, l))

    expect_failure(check.parallel_scan, sequential, ref_combine, match="log-depth")
    expect_failure(check.parallel_scan, exclusive, ref_combine, match="exclusive")
    expect_failure(check.parallel_scan, swapped, ref_combine, match="earlier step")


def test_causal_conv1d_rejects():
    def right_pad(x, w, b):
        return F.conv1d(F.pad(x, (0, w.shape[1] - 1)), w[:, None], b, groups=x.shape[1])

    def symmetric(x, w, b):
        return F.conv1d(x, w[:, None], b, padding=(w.shape[1] - 1) // 2, groups=x.shape[1])

    expect_failure(check.causal_conv1d, right_pad, match="leaks the future")
    expect_failure(check.causal_conv1d, symmetric, match="symmetric")
    expect_failure(check.causal_conv1d, lambda x, w, b: ref_conv(x, w.flip(-1), b), match="reversed")


def test_block_forward_rejects():
    expect_failure(check.block_forward, lambda blk, u: block_forward(blk, u, softplus_first=True), match="softplus")
    expect_failure(check.block_forward, lambda blk, u: block_forward(blk, u, gate=False), match="gate")
    expect_failure(check.block_forward, lambda blk, u: block_forward(blk, u, leak=True))


def test_mamba_step_rejects():
    expect_failure(check.mamba_step, lambda *a: mamba_step(*a, skip=False), match="D skip")
    expect_failure(check.mamba_step, lambda *a: mamba_step(*a, exp=False), match="forgot the exp")
    expect_failure(check.mamba_step, lambda *a: mamba_step(*a, shift=False), match="conv sees only")
    expect_failure(check.mamba_step, lambda *a: mamba_step(*a, grow=True), match="fixed shapes")
