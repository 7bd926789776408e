"""Chapter 10's GPU-speed kernels (fused/attention_gpu.py, fused/scan_gpu.py) on Numba's simulator.

The attention forward against SDPA in float64 on random shapes: lengths that are not multiples of the
tiles (64 in float32, 32 in float64), fewer queries than keys, causal or not, head sizes that are not
multiples of the 8 lanes of a row; the backward's gradients against SDPA's. The scan forward against
chapter 05's loop in float64, its checkpoints against the teaching kernel's, and the backward's
gradients against the loop's under autograd. The warp shuffles that warps.py gives the simulator against
numpy, and a lane that skips a shuffle is named. Each kernel sizes its arrays with constants and is
compiled once per (dtype, head size) or (dtype, N). The simulator runs every thread as a Python thread:
the sizes stay tiny (128 threads a block for attention, 32 for the scan).
"""

import math

import numba
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from numba import cuda

from course_lib.cuda.launch import _non_constant_sizes
from course_lib.fused import attention_cuda, attention_gpu, scan_cuda, scan_gpu, warps
from course_lib.mamba.scan import selective_scan_sequential

torch.set_num_threads(1)


def sdpa64(q, k, v, causal, scale=None):
    """out and lse in float64; causal means key j is seen by query i when j <= i + Tk - Tq."""
    q, k, v = (t.double() for t in (q, k, v))
    Tq, Tk = q.shape[2], k.shape[2]
    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq) if causal else None
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    scores = q @ k.transpose(-2, -1) * scale
    lse = (scores.masked_fill(~mask, -math.inf) if causal else scores).logsumexp(-1)
    return out, lse


def inputs(seed, B, H, Tq, Tk, d, dv, dtype):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g, dtype=torch.float64).mul(1.5).to(dtype)
                 for s in ((B, H, Tq, d), (B, H, Tk, d), (B, H, Tk, dv)))


# (B, H, Tq, Tk, d, dv, causal): at most 3 blocks of 128 threads each
FLOAT64 = [(1, 1, 37, 37, 8, 8, True), (2, 1, 20, 45, 5, 7, True), (1, 2, 1, 40, 4, 3, True)]
FLOAT32 = [(1, 1, 19, 75, 6, 10, False), (1, 1, 65, 100, 3, 4, True)]


@pytest.mark.parametrize("B, H, Tq, Tk, d, dv, causal", FLOAT64)
def test_attention_forward_matches_sdpa_float64(B, H, Tq, Tk, d, dv, causal):
    q, k, v = inputs(Tq * 131 + Tk, B, H, Tq, Tk, d, dv, torch.float64)
    out, lse = attention_gpu.forward(q, k, v, causal)
    ref_out, ref_lse = sdpa64(q, k, v, causal)
    torch.testing.assert_close(out, ref_out, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("B, H, Tq, Tk, d, dv, causal", FLOAT32)
def test_attention_forward_float32_is_accumulated_in_float32_and_close(B, H, Tq, Tk, d, dv, causal):
    q, k, v = inputs(Tq * 17 + Tk, B, H, Tq, Tk, d, dv, torch.float32)
    out, lse = attention_gpu.forward(q, k, v, causal, scale=0.4)
    assert out.dtype == lse.dtype == torch.float32
    ref_out, ref_lse = sdpa64(q, k, v, causal, scale=0.4)
    torch.testing.assert_close(out.double(), ref_out, rtol=2e-5, atol=2e-6)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=2e-5, atol=2e-6)


def sdpa64_grads(q, k, v, do, causal):
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    Tq, Tk = q.shape[2], k.shape[2]
    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq) if causal else None
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return torch.autograd.grad(out, (q, k, v), do.double())


@pytest.mark.parametrize("dtype, Tq, Tk, d, dv, causal, tol", [(torch.float64, 9, 20, 4, 3, True, 1e-11),
                                                                (torch.float32, 12, 12, 3, 5, False, 2e-5)])
def test_attention_backward_matches_sdpa_gradients(dtype, Tq, Tk, d, dv, causal, tol):
    """Tiny: on the simulator each of the backward's warp shuffles is a barrier of 32 Python threads."""
    H = 2 if dtype == torch.float64 else 1                                 # two heads: two rows of blocks
    q, k, v = inputs(Tq + Tk, 1, H, Tq, Tk, d, dv, dtype)
    do = torch.randn(1, H, Tq, dv, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
    out, lse = attention_gpu.forward(q, k, v, causal)
    grads = attention_gpu.backward(q, k, v, do, lse, (do * out).sum(-1), causal)
    for mine, ref in zip(grads, sdpa64_grads(q, k, v, do, causal)):
        assert mine.dtype == dtype
        torch.testing.assert_close(mine.double(), ref, rtol=tol, atol=tol)


def test_the_ops_cuda_forward_is_the_fast_kernel_and_the_teaching_kernel_agrees():
    q, k, v = inputs(5, 1, 1, 21, 21, 4, 4, torch.float64)
    out, lse = attention_cuda.forward(q, k, v, True)
    slow_out, slow_lse = attention_cuda.forward_teaching(q, k, v, True)
    torch.testing.assert_close(out, slow_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, slow_lse, rtol=1e-12, atol=1e-12)


def test_kernels_are_compiled_once_per_dtype_and_head_size_with_constant_array_sizes():
    kernels = [kernel for t in (numba.float32, numba.float64) for d, dv in ((64, 64), (40, 24), (5, 7))
               for kernel in (attention_gpu.forward_kernel(t, d, dv), *attention_gpu.backward_kernels(t, d, dv))]
    kernels += [k(t, n) for t in (numba.float32, numba.float64) for n in (16, 3)
                for k in (scan_gpu.forward_kernel, scan_gpu.backward_kernel)]
    assert attention_gpu.forward_kernel(numba.float32, 64, 64) is kernels[0]
    for kernel in kernels:
        assert _non_constant_sizes(kernel.py_func) == (), kernel.py_func.__qualname__


def test_attention_shared_memory_fits_a_block_in_float32_and_float64():
    """Static shared memory is 48 KiB at most. Forward: q's tile, one buffer for K's then P's tile, V's tile;
    backward: two tiles of rows (q and dO, or k and v) and two numbers per row."""
    for dtype, size in ((numba.float32, 4), (numba.float64, 8)):
        BQ, BK = attention_gpu.tiles(dtype)
        D = attention_gpu.D_MAX
        forward = D * BQ + max(D * BK, BK * BQ) + BK * D
        backward = 2 * BQ * D + 2 * BQ
        assert max(forward, backward) * size <= 48 * 1024, (dtype, forward * size, backward * size)


def scan_inputs(seed, b, L, D, N, dtype):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)   # noqa: E731
    args = (r(b, L, D), F.softplus(2 * r(b, L, D) - 1), -torch.exp(r(D, N)), r(b, L, N), r(b, L, N), r(D))
    return tuple(a.to(dtype) for a in args)


@pytest.mark.parametrize("b, L, D, N, chunk", [(2, 37, 5, 3, 8), (1, 41, 35, 16, 16), (1, 16, 33, 4, 5)])
def test_scan_forward_matches_the_loop_and_saves_the_teaching_kernels_checkpoints(b, L, D, N, chunk):
    args = scan_inputs(b * L + D, b, L, D, N, torch.float64)
    y, h, ckpt = scan_gpu.scan_forward(*args, chunk)
    ref_y, ref_h = selective_scan_sequential(*args, return_state=True)
    torch.testing.assert_close(y, ref_y, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(h, ref_h, rtol=1e-11, atol=1e-11)
    _, _, slow_ckpt = scan_cuda.scan_forward_teaching(*args, chunk)
    torch.testing.assert_close(ckpt, slow_ckpt, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("dtype, b, L, D, N, chunk", [(torch.float64, 2, 21, 5, 3, 8), (torch.float64, 1, 37, 35, 4, 16),
                                                      (torch.float32, 1, 20, 33, 16, 8)])
def test_scan_backward_matches_the_loops_gradients(dtype, b, L, D, N, chunk):
    """Every input's gradient against chapter 05's loop under autograd (float64), with a gradient for the last
    state too; D = 33 and 35 leave idle threads in the last group of 32 channels."""
    args = scan_inputs(L * D + N, b, L, D, N, dtype)
    g = torch.Generator().manual_seed(7)
    dy, dh = torch.randn(b, L, D, generator=g).to(dtype), torch.randn(b, D, N, generator=g).to(dtype)
    _, _, ckpt = scan_gpu.scan_forward(*args, chunk)
    mine = scan_gpu.scan_backward(*args, ckpt, dy, dh, chunk)
    leaves = [a.detach().double().requires_grad_() for a in args]
    y, h = selective_scan_sequential(*leaves, return_state=True)
    ref = torch.autograd.grad((y * dy.double()).sum() + (h * dh.double()).sum(), leaves)
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    for name, m, r in zip(("dx", "ddelta", "dA", "dB", "dC", "dD"), mine, ref):
        assert m.dtype == dtype, name
        torch.testing.assert_close(m.double(), r, rtol=tol, atol=tol * max(1.0, r.abs().max().item()), msg=name)


def test_scan_forward_float32():
    args = scan_inputs(3, 1, 40, 35, 4, torch.float32)
    y, h, _ = scan_gpu.scan_forward(*args, 16)
    assert y.dtype == h.dtype == torch.float32
    ref_y, ref_h = selective_scan_sequential(*(a.double() for a in args), return_state=True)
    torch.testing.assert_close(y.double(), ref_y, rtol=1e-4, atol=1e-4 * ref_y.abs().max().item())
    torch.testing.assert_close(h.double(), ref_h, rtol=1e-4, atol=1e-4 * ref_h.abs().max().item())


# ---- the simulator's warp shuffles (fused/warps.py) --------------------------------------------------

@cuda.jit
def k_warp_sum_and_broadcast(a, total, first):
    i = cuda.grid(1)
    x = a[i]
    for step in (16, 8, 4, 2, 1):
        x += cuda.shfl_xor_sync(0xFFFFFFFF, x, step)
    total[i] = x
    first[i] = cuda.shfl_sync(0xFFFFFFFF, a[i], 3)


@cuda.jit
def k_lane_skips(a, out):
    i = cuda.grid(1)
    if i % 32 != 5:
        out[i] = cuda.shfl_xor_sync(0xFFFFFFFF, a[i], 1)


def test_warp_shuffles_on_the_simulator_reduce_and_broadcast_within_each_warp():
    if not numba.config.ENABLE_CUDASIM:
        pytest.skip("warps.py teaches the simulator; a GPU has its own shuffles")
    a = np.random.default_rng(0).standard_normal(64)
    total, first = np.zeros(64), np.zeros(64)
    k_warp_sum_and_broadcast[2, 32](a, total, first)
    np.testing.assert_allclose(total, np.repeat(a.reshape(2, 32).sum(1), 32), rtol=1e-12)
    np.testing.assert_array_equal(first, np.repeat(a[[3, 35]], 32))


def test_a_lane_that_skips_a_shuffle_is_named(monkeypatch):
    if not numba.config.ENABLE_CUDASIM:
        pytest.skip("warps.py teaches the simulator; on a GPU this would hang")
    monkeypatch.setattr(warps, "TIMEOUT", 1)
    with pytest.raises(Exception, match="not every lane of the warp"):
        k_lane_skips[1, 32](np.ones(32), np.zeros(32))
