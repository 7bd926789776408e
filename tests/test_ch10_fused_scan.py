"""The fused selective scan equals chapter 05's sequential loop, forward and every gradient.

Oracle: `selective_scan_sequential` and torch autograd, in float64. The Numba CPU kernels run
through the custom op; the CUDA kernels run on Numba's simulator (no GPU here) at a few dozen
threads, and must give what the CPU kernels give.
"""

import math
import platform
import re

import numba
import numpy as np
import pytest
import torch

from course_lib.fused import models, scan_cuda
from course_lib.fused.scan_op import selective_scan, selective_scan_fused
from course_lib.mamba import Mamba, MambaCache, MambaConfig
from course_lib.mamba.scan import scan_kernel, selective_scan_sequential
from course_lib.simd.fastexp import exp_neg

NAMES = ("x", "delta", "A", "B", "C", "D")


def inputs(seed, b, L, D, N, dtype=torch.float64):
    """Random inputs as Mamba makes them: Δ > 0 of both sizes, A < 0, signed x, B, C, D."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)   # noqa: E731
    delta = torch.nn.functional.softplus(2 * r(b, L, D) - 1)
    return r(b, L, D), delta, -torch.exp(r(D, N)), r(b, L, N), r(b, L, N), r(D)


def grads(scan, args, dy, dh, **kw):
    """y, the final state, and the gradient of sum(y * dy) + sum(h * dh) for every input."""
    args = [a.clone().requires_grad_() for a in args]
    y, h = scan(*args, return_state=True, **kw)
    return y, h, torch.autograd.grad((y * dy).sum() + (h * dh).sum(), args)


def random_shapes(seed, count):
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(1, 4)), int(rng.integers(1, 90)), int(rng.integers(1, 24)), int(rng.integers(1, 20)),
             int(rng.choice([1, 5, 8, 64]))) for _ in range(count)]


@pytest.mark.parametrize("b, L, D, N, chunk", [(2, 37, 5, 3, 8), (1, 1, 1, 1, 64), (3, 64, 7, 16, 8)] + random_shapes(10, 4))
def test_forward_and_every_gradient_equal_the_sequential_loop_float64(b, L, D, N, chunk):
    args = inputs(b * 1000 + L, b, L, D, N)
    g = torch.Generator().manual_seed(L)
    dy, dh = torch.randn(b, L, D, generator=g, dtype=torch.float64), torch.randn(b, D, N, generator=g, dtype=torch.float64)
    y, h, mine = grads(selective_scan_fused, args, dy, dh, chunk=chunk)
    y_ref, h_ref, theirs = grads(selective_scan_sequential, args, dy, dh)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(h, h_ref, rtol=1e-10, atol=1e-10)
    for name, m, t in zip(NAMES, mine, theirs):
        torch.testing.assert_close(m, t, rtol=1e-10, atol=1e-10, msg=lambda s: f"d{name}: {s}")   # noqa: B023


def test_float32_is_close_to_float64_and_huge_decays_stay_finite():
    args = inputs(7, 2, 150, 11, 16)
    args[1][0, 40:60] *= 1e3                      # Δ A around -1e3: exp underflows, nothing may blow up
    g = torch.Generator().manual_seed(8)
    dy, dh = torch.randn(2, 150, 11, generator=g, dtype=torch.float64), torch.randn(2, 11, 16, generator=g, dtype=torch.float64)
    y64, h64, g64 = grads(selective_scan_fused, args, dy, dh)
    y_ref, h_ref, g_ref = grads(selective_scan_sequential, args, dy, dh)
    for m, t in zip((y64, h64, *g64), (y_ref, h_ref, *g_ref)):
        torch.testing.assert_close(m, t, rtol=1e-9, atol=1e-9)
    y32, h32, g32 = grads(selective_scan_fused, [a.float() for a in args], dy.float(), dh.float())
    assert y32.dtype == torch.float32 and all(g.dtype == torch.float32 for g in g32)
    for m, t in zip((y32, h32, *g32), (y_ref, h_ref, *g_ref)):
        scale = t.abs().max().item()
        torch.testing.assert_close(m.double() / scale, t / scale, rtol=0, atol=2e-5)


def test_opcheck_and_the_saved_states_are_one_in_chunk():
    args = [a.requires_grad_() for a in inputs(3, 2, 13, 5, 3)]
    torch.library.opcheck(selective_scan, (*args, 4))
    y, h_last, ckpt = selective_scan(*args, 4)
    assert y.shape == (2, 13, 5) and h_last.shape == (2, 5, 3) and ckpt.shape == (2, 4, 5, 3)   # ceil(13 / 4) states


def random_mamba(scan, selective):
    torch.manual_seed(0)
    model = Mamba(MambaConfig(vocab_size=29, d_model=12, n_layer=2, d_state=5, scan=scan, selective=selective))
    with torch.no_grad():                          # far from the init, so every parameter matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


@pytest.mark.parametrize("selective", [True, False])   # False: Δ, B, C are expanded (non-contiguous) constants
def test_mamba_with_the_fused_scan_gives_the_same_logits_state_and_gradients(selective):
    idx = torch.randint(0, 29, (2, 23), generator=torch.Generator().manual_seed(1))
    mambas = {scan: random_mamba(scan, selective) for scan in ("fused", "sequential")}
    with models.running():                         # chapter 10's kernels plugged in
        losses = {scan: model(idx, targets=idx)[1] for scan, model in mambas.items()}
        torch.testing.assert_close(losses["fused"], losses["sequential"], rtol=1e-5, atol=1e-5)
        for loss in losses.values():
            loss.backward()
        for (name, p), q in zip(mambas["fused"].named_parameters(), mambas["sequential"].parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda s: f"{name}: {s}")   # noqa: B023
        with torch.no_grad():                      # the final state (return_state), then 3 recurrent steps
            logits = {}
            for scan, model in mambas.items():
                cache = MambaCache(2)
                logits[scan] = torch.cat([model(idx, cache=cache)[0], model(idx[:, :3], cache=cache)[0]], 1)
    torch.testing.assert_close(logits["fused"], logits["sequential"], rtol=1e-5, atol=1e-5)


def test_a_kernel_of_ones_own_plugs_into_mamba():
    """scan_kernel(fn) makes fn the "fused" scan inside the block, and only there: outside, chapter 05's
    Mamba has no fused kernel and says so."""
    model = random_mamba("fused", True)
    idx = torch.randint(0, 29, (2, 11), generator=torch.Generator().manual_seed(3))
    calls = []

    def mine(x, delta, A, B, C, D, return_state=False):
        calls.append(tuple(x.shape))
        return selective_scan_sequential(x, delta, A, B, C, D, return_state=return_state)

    with torch.no_grad():
        with scan_kernel(mine):
            logits = model(idx)[0]
        assert calls == [(2, 11, 24)] * 2                       # one call per layer (d_inner = 2 * d_model)
        with pytest.raises(RuntimeError, match="scan_kernel"):
            model(idx)
        with models.running():
            torch.testing.assert_close(model(idx)[0], logits, rtol=1e-5, atol=1e-5)   # the course's kernel
    assert len(calls) == 2


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cuda_kernels_equal_the_cpu_kernels(dtype):
    assert numba.cuda.is_available() or numba.config.ENABLE_CUDASIM
    b, L, D, N, chunk = 2, 19, 7, 5, 6             # 14 threads: cheap on the simulator
    args = inputs(11, b, L, D, N, dtype)
    g = torch.Generator().manual_seed(12)
    dy, dh = torch.randn(b, L, D, generator=g, dtype=dtype), torch.randn(b, D, N, generator=g, dtype=dtype)
    y, h, ckpt = scan_cuda.scan_forward(*args, chunk)
    y_cpu, h_cpu, ckpt_cpu = selective_scan(*args, chunk)
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-5)
    for m, t in zip((y, h, ckpt), (y_cpu, h_cpu, ckpt_cpu)):
        torch.testing.assert_close(m, t, **tol)
    mine = scan_cuda.scan_backward(*args, ckpt, dy, dh, chunk)
    _, _, theirs = grads(selective_scan_fused, args, dy, dh, chunk=chunk)
    for name, m, t in zip(NAMES, mine, theirs):
        torch.testing.assert_close(m, t, **tol, msg=lambda s: f"d{name}: {s}")   # noqa: B023


@numba.njit(fastmath={"contract"})
def _exp_loop(z, out):
    for i in range(z.shape[0]):
        out[i] = exp_neg(z[i])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fast_exp_is_accurate(dtype):
    z = np.concatenate([-np.random.default_rng(0).exponential(4.0, 5001), [0.0, -1e-30, -80, -700, -1e5]]).astype(dtype)
    out = np.empty_like(z)
    _exp_loop(z, out)
    ref = np.exp(z.astype(np.float64))
    normal = ref > 4 * np.finfo(dtype).tiny
    ulp = np.finfo(dtype).eps
    assert np.all(np.abs(out[normal] - ref[normal]) <= 4 * ulp * ref[normal])
    assert np.all((out[~normal] >= 0) & (out[~normal] <= 2 * np.finfo(dtype).tiny))   # clamped, never subnormal
    assert exp_neg(-1.5) == pytest.approx(math.exp(-1.5))


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="reads x86 assembly")
def test_fast_exp_loop_compiles_to_packed_instructions():
    z = np.linspace(-50, 0, 37, dtype=np.float32)
    _exp_loop(z, np.empty_like(z))
    asm = _exp_loop.inspect_asm((numba.typeof(z), numba.typeof(z)))
    assert re.search(r"\b(v?fmadd\w*ps|v?mulps)\b", asm), "the exp loop did not vectorize"
    assert not re.search(r"call\w*\s+\S*exp", asm), "the exp loop calls the C library"
