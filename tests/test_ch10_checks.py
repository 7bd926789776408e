"""Chapter 10's checks pass on the reference kernels and reject the usual mistakes, including kernels
whose values are right but which break the property the chapter teaches: a scan that keeps every
state, attention that builds the (T, T) scores, a CUDA kernel without its barriers, an op that
works eagerly but cannot be traced.

The references are the course's own kernels (same signatures as the exercises). The wrong ones are
written in numpy where a check only sees values and memory (fast, nothing to compile), and as CUDA
kernels on the simulator where the shared tiles are the point.
"""

import itertools
import math

import numba
import numpy as np
import pytest
import torch
from checking import expect_failure, expect_pass

from course_lib import device

device.setup(verbose=False)
from numba import cuda, float64  # noqa: E402  (after the device is chosen)

from course_lib.checks import ch10 as check  # noqa: E402
from course_lib.fused import attention_cpu, attention_cuda, attention_op, scan_cpu  # noqa: E402

TILE, D_MAX = 16, 16
T = torch.Tensor


def _stub(*args, **kwargs):
    raise NotImplementedError


# ---- 1. the online-softmax update ---------------------------------------------------------------

def update(m, l, acc, scores, values, rescale_l=True, rescale_acc=True):
    m_new = np.maximum(m, scores.max(1))
    alpha = np.exp(m - m_new)
    p = np.exp(scores - m_new[:, None])
    l_new = (alpha * l if rescale_l else l) + p.sum(1)
    acc_new = (alpha[:, None] * acc if rescale_acc else acc) + p @ values
    return m_new, l_new, acc_new


def test_online_softmax_update():
    expect_pass(check.online_softmax_update, update)
    expect_failure(check.online_softmax_update, _stub, match="not implemented yet")
    expect_failure(check.online_softmax_update, lambda *a: update(*a, rescale_l=False), match="rescale the old sum")
    expect_failure(check.online_softmax_update, lambda *a: update(*a, rescale_acc=False), match="rescale the old accumulator")
    expect_failure(check.online_softmax_update, lambda m, l, acc, s, v: update(np.full_like(m, -np.inf), l, acc, s, v),
                   match="remember the old m")


# ---- 2. the fused scan ----------------------------------------------------------------------------

def scan_numpy(x, delta, A, B, C, D, y, h_last, ckpt, chunk, history=False, ckpt_after=False, skip=True,
               write_last=True):
    """One channel at a time, in numpy; history=True keeps the (L, N) states of the channel (right values)."""
    bsz, L, Dm = x.shape
    for b, d in itertools.product(range(bsz), range(Dm)):
        h = np.zeros(A.shape[1], x.dtype)
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


def test_fused_scan_passes_on_the_course_kernel_and_fails_on_the_stub():
    expect_pass(check.fused_scan, scan_cpu.scan_forward)
    expect_pass(check.fused_scan, scan_numpy)
    expect_failure(check.fused_scan, _stub, match="not implemented yet")


def test_fused_scan_rejects():
    expect_failure(check.fused_scan, lambda *a: scan_numpy(*a, history=True), match="One (L, N) history")
    expect_failure(check.fused_scan, lambda *a: scan_numpy(*a, ckpt_after=True), match="before the step's update")
    expect_failure(check.fused_scan, lambda *a: scan_numpy(*a, skip=False), match="D skip")
    expect_failure(check.fused_scan, lambda *a: scan_numpy(*a, write_last=False), match="h_last")


# ---- 3. and 4. FlashAttention in numpy, right and wrong ---------------------------------------

def flash_numpy(q, k, v, out, lse, scale, causal, BQ, BK, shift=0, first_keys=False, drop_last=False,
                no_scale=False, lse_is_m=False, skip_last_rows=False, whole=False, no_skip=False):
    """Tiled attention with the online softmax in numpy; whole=True builds each head's (T, T) scores, and
    no_skip=True visits the causal tiles above the diagonal (right values, twice the work)."""
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
            m, den, acc = np.full(len(qi), -np.inf), np.zeros(len(qi)), np.zeros((len(qi), v.shape[2]))
            k_stop = Tk // BK * BK if drop_last else Tk
            if causal and not no_skip:
                k_stop = max(0, min(k_stop, i0 + len(qi) + offset + shift))
            for j0 in range(0, k_stop, BK):
                s = qi @ k[h, j0:j0 + BK].T * scale
                if causal:
                    s = np.where(np.arange(j0, j0 + s.shape[1])[None, :] <= rows + offset + shift, s, -np.inf)
                m_new = np.maximum(m, s.max(1))
                alpha, p = np.exp(m - m_new), np.exp(s - m_new[:, None])
                den, acc, m = alpha * den + p.sum(1), alpha[:, None] * acc + p @ v[h, j0:j0 + BK], m_new
            out[h, i0:i0 + BQ] = acc / den[:, None]
            lse[h, i0:i0 + BQ] = m if lse_is_m else m + np.log(den)


def test_flash_forward_passes_on_the_course_kernel_and_fails_on_the_stub():
    expect_pass(check.flash_forward, attention_cpu.forward_kernel)
    expect_pass(check.flash_forward, flash_numpy)
    expect_failure(check.flash_forward, _stub, match="not implemented yet")


@pytest.mark.parametrize("mistake, match", [
    (dict(whole=True), "One (T, T) matrix of scores"),             # right values, (T, T) memory
    (dict(shift=1), "off by one"),
    (dict(first_keys=True), "LAST Tq of the Tk positions"),
    (dict(drop_last=True), "must not be dropped"),
    (dict(no_scale=True), "multiplied by scale"),
    (dict(lse_is_m=True), "lse is m + log(l)"),
    (dict(skip_last_rows=True), "never written"),
    (dict(no_skip=True), "visits key tiles above the diagonal"),   # right values, twice the work
])
def test_flash_forward_rejects(mistake, match):
    with np.errstate(all="ignore"):
        expect_failure(check.flash_forward, lambda *a: flash_numpy(*a, **mistake), match=match)


def flash_backward_numpy(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK, use_delta=True, scale_dq=True,
                         zero_dq=True, whole=False, no_skip=False):
    """By key tiles, recomputing P from lse, in numpy; whole=True builds each head's (T, T) P and dS, and
    no_skip=True visits the query rows above the diagonal (right values, twice the work)."""
    BH, Tq, _ = q.shape
    Tk = k.shape[1]
    if zero_dq:
        dq[:] = 0
    for h in range(BH):
        D = (do[h] * o[h]).sum(1) if use_delta else np.zeros(Tq)
        tiles = [(0, Tk)] if whole else [(j0, min(j0 + BK, Tk)) for j0 in range(0, Tk, BK)]
        for j0, j1 in tiles:
            r0 = max(0, j0 - (Tk - Tq)) if causal and not (no_skip or whole) else 0   # rows that see a key of the tile
            qh, doh = q[h, r0:], do[h, r0:]
            s = qh @ k[h, j0:j1].T * scale
            if causal:
                s = np.where(np.arange(j0, j1)[None, :] <= np.arange(r0, Tq)[:, None] + Tk - Tq, s, -np.inf)
            p = np.exp(s - lse[h, r0:][:, None])
            ds = p * (doh @ v[h, j0:j1].T - D[r0:, None])
            dv[h, j0:j1] = p.T @ doh
            dk[h, j0:j1] = ds.T @ qh * scale
            dq[h, r0:] += ds @ k[h, j0:j1] * (scale if scale_dq else 1)


def test_flash_backward_passes_on_the_course_kernel_and_fails_on_the_stub():
    expect_pass(check.flash_backward, attention_cpu.backward_kernel)
    expect_pass(check.flash_backward, flash_backward_numpy)
    expect_failure(check.flash_backward, _stub, match="not implemented yet")


@pytest.mark.parametrize("mistake, match", [
    (dict(whole=True), "One (T, T) matrix of scores"),             # right values, (T, T) memory
    (dict(use_delta=False), "D_i = rowsum(dO_i * O_i)"),
    (dict(scale_dq=False), "dQ = dS K * scale"),
    (dict(zero_dq=False), "set dq to 0"),
    (dict(no_skip=True), "visits key tiles above the diagonal"),   # right values, twice the work
])
def test_flash_backward_rejects(mistake, match):
    with np.errstate(all="ignore"):
        expect_failure(check.flash_backward, lambda *a: flash_backward_numpy(*a, **mistake), match=match)


# ---- 5. the CUDA kernel, on the simulator -----------------------------------------------------

def cuda_kernel(sync_after_load=True, sync_after_use=True, idle_threads_load=True, load_row="key", scaled=True):
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
        k_end = min(Tk, i0 + TILE + Tk - Tq) if causal else Tk
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


def test_attention_op_passes_on_the_course_register_and_fails_on_the_stub():
    expect_pass(check.attention_op, attention_op.register)
    expect_failure(check.attention_op, _stub, match="not implemented yet")


@pytest.mark.parametrize("mistake, match", [
    (dict(contiguous_grads=False), "transposed views"),     # right on contiguous tensors, wrong on the GPT's views
    (dict(fake=False), "opcheck failed"),                   # right eagerly, cannot be traced
    (dict(backward_op=False), "opcheck failed"),            # the backward runs numpy on fake tensors
    (dict(lse_differentiable=True), "non-differentiable"),
])
def test_attention_op_rejects(mistake, match):
    expect_failure(check.attention_op, lambda name, f, b: register(name, f, b, **mistake), match=match)

