"""Tiled attention (course_lib.fused.attention_*) against F.scaled_dot_product_attention in float64.

Values and the gradients of q, k and v, causal or not, on random shapes whose lengths are not
multiples of the tiles (the CPU kernel's, the CUDA kernel's 16), also with fewer queries than
keys (a KV cache). The CUDA kernels run on Numba's simulator at tiny sizes. The op passes opcheck,
its log-sum-exp output is right (and marked non-differentiable), chapter 04's GPT gives the same
logits with it once chapter 10's kernels are plugged in (`fused.models.running`), a kernel of one's
own plugs into the GPT through `attention_kernel`, the forward's scratch stays its tiles' whatever T
while naive attention's grows like T^2, and the tile helpers of course_lib.simd equal numpy.
"""

import numba
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from course_lib.fused import attention_cpu, attention_cuda, models
from course_lib.fused.attention_memory import memory_curve
from course_lib.fused.attention_op import attention, attention_forward, naive_attention
from course_lib.gpt.model import GPT, GPTConfig, KVCache, attention_kernel
from course_lib.memory import growth
from course_lib.simd.tiles import matmul, row_max, transpose

torch.set_num_threads(1)
TOL = dict(rtol=1e-10, atol=1e-10)


def qkv(seed, B, H, Tq, Tk, d, dv=None, dtype=torch.float64):
    g = np.random.default_rng(seed)
    shapes = [(B, H, Tq, d), (B, H, Tk, d), (B, H, Tk, dv or d), (B, H, Tq, dv or d)]
    q, k, v, dout = (torch.tensor(g.uniform(-2, 2, s), dtype=dtype) for s in shapes)
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), dout


def reference(q, k, v, causal):
    """SDPA, with the mask written out when the queries are the last Tq of the Tk positions."""
    Tq, Tk = q.shape[2], k.shape[2]
    if causal and Tq != Tk:
        mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def assert_matches(fn, q, k, v, dout, causal, **tol):
    out, ref = fn(q, k, v, causal), reference(q, k, v, causal)
    torch.testing.assert_close(out, ref, **tol)
    for mine, theirs in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(ref, (q, k, v), dout)):
        torch.testing.assert_close(mine, theirs, **tol)


RANDOM = [tuple(int(x) for x in np.random.default_rng(s).integers((1, 1, 2, 2), (3, 4, 200, 20))) for s in range(6)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("B, H, T, d", [(1, 1, 64, 8), (2, 3, 129, 5), (1, 2, 1, 4)] + RANDOM)
def test_cpu_matches_sdpa_float64(B, H, T, d, causal):
    assert_matches(attention, *qkv(B * 1000 + T, B, H, T, T, d), causal, **TOL)


@pytest.mark.parametrize("fn", [attention, naive_attention], ids=["fused", "naive"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("Tq, Tk, dv", [(1, 150, 6), (70, 131, 11), (3, 3, 1)])
def test_fewer_queries_than_keys_and_other_value_size(Tq, Tk, dv, causal, fn):
    assert_matches(fn, *qkv(Tq + Tk, 2, 2, Tq, Tk, 7, dv), causal, **TOL)


def test_cpu_float32_is_close():
    q, k, v, dout = qkv(7, 2, 2, 150, 150, 32, dtype=torch.float32)
    assert attention(q, k, v).dtype == torch.float32
    assert_matches(attention, q, k, v, dout, True, rtol=1e-4, atol=1e-5)


def test_lse_is_the_logsumexp_of_the_scaled_scores_and_not_differentiable():
    """lse = logsumexp of the scaled scores, saved for the backward; out's gradients are unchanged by it."""
    q, k, v, dout = qkv(8, 2, 2, 77, 77, 6)
    out, lse = attention_forward(q, k, v, True, 0.37)
    scores = (q @ k.transpose(-2, -1) * 0.37).masked_fill(torch.ones(77, 77, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse, scores.logsumexp(-1), **TOL)
    assert out.requires_grad and not lse.requires_grad
    ref_out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.37)
    for mine, theirs in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(ref_out, (q, k, v), dout)):
        torch.testing.assert_close(mine, theirs, **TOL)


@pytest.mark.parametrize("BQ, BK", [(1, 1), (3, 5), (64, 16), (128, 64)])
def test_kernels_take_any_tiles(BQ, BK):
    """The kernels' tile sizes are arguments: one-row tiles, tiles that do not divide T, BQ != BK."""
    g = np.random.default_rng(BQ * 100 + BK)
    q, k, v, do = (g.uniform(-2, 2, (3, T, 7)) for T in (37, 50, 50, 37))
    out, lse = np.full((3, 37, 7), np.nan), np.full((3, 37), np.nan)
    attention_cpu.forward_kernel(q, k, v, out, lse, 0.4, True, BQ, BK)
    grads = [np.full(a.shape, np.nan) for a in (q, k, v)]
    attention_cpu.backward_kernel(q, k, v, out, do, lse, *grads, 0.4, True, BQ, BK)
    t = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    ref = F.scaled_dot_product_attention(*t, attn_mask=torch.ones(37, 50, dtype=torch.bool).tril(13), scale=0.4)
    torch.testing.assert_close(torch.from_numpy(out), ref, **TOL)
    for mine, theirs in zip(grads, torch.autograd.grad(ref, t, torch.from_numpy(do))):
        torch.testing.assert_close(torch.from_numpy(mine), theirs, **TOL)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_opcheck(causal):
    q, k, v, _ = qkv(10, 2, 2, 19, 19, 8)
    torch.library.opcheck(attention_forward, (q, k, v, causal, 0.3))
    q, k, v = (t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (q, k, v))
    torch.library.opcheck(attention_forward, (q, k, v, causal, 0.3))   # strided views, as the GPT passes them


# ---- the CUDA kernels, on the simulator: a few hundred threads at most -----------------------


def cuda_attention(q, k, v, causal):
    class Cuda(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            out, lse = attention_cuda.forward(q, k, v, causal)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse = ctx.saved_tensors
            return attention_cuda.backward(q, k, v, dout, lse, (dout * out).sum(-1), causal)

    return Cuda.apply(q, k, v)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("Tq, Tk, d, dv", [(19, 19, 8, 8), (5, 21, 3, 7)])
def test_cuda_kernels_match_sdpa_float64(Tq, Tk, d, dv, causal):
    q, k, v, dout = qkv(Tq * Tk + d, 2, 1, Tq, Tk, d, dv)
    assert 2 * ((max(Tq, Tk) + 15) // 16) * attention_cuda.TILE <= 200     # threads per launch
    assert_matches(cuda_attention, q, k, v, dout, causal, **TOL)


def test_cuda_kernels_float32_forward():
    q, k, v, _ = qkv(11, 1, 2, 19, 19, 8, dtype=torch.float32)
    out, lse = attention_cuda.forward(q.detach(), k.detach(), v.detach(), True)
    assert out.dtype == lse.dtype == torch.float32
    torch.testing.assert_close(out, reference(q, k, v, True), rtol=1e-5, atol=1e-6)


# ---- chapter 04's GPT, and memory ------------------------------------------------------------


def test_gpt_with_fused_attention_gives_the_same_logits_and_gradients():
    config = dict(vocab_size=53, block_size=29, n_layer=2, n_head=3, n_embd=24)
    torch.manual_seed(0)
    ref = GPT(GPTConfig(**config)).double()
    ours = GPT(GPTConfig(**config, fused=True)).double()
    ours.load_state_dict(ref.state_dict())
    idx, targets = torch.randint(0, 53, (2, 29)), torch.randint(0, 53, (2, 29))
    with models.running():                      # chapter 10's kernel plugged into the GPT
        (logits, loss), (ref_logits, ref_loss) = ours(idx, targets), ref(idx, targets)
        torch.testing.assert_close(logits, ref_logits, **TOL)
        loss.backward()
        ref_loss.backward()
        grads = dict(ref.named_parameters())
        for name, p in ours.named_parameters():
            torch.testing.assert_close(p.grad, grads[name].grad, **TOL)
        with torch.no_grad():                   # with a KV cache: 21 queries then 1 at a time
            caches = KVCache(2), KVCache(2)
            for part in (idx[:, :21], idx[:, 21:22], idx[:, 22:23]):
                torch.testing.assert_close(ours(part, cache=caches[0])[0], ref(part, cache=caches[1])[0], **TOL)


def test_a_kernel_of_ones_own_plugs_into_the_gpt():
    """attention_kernel(fn) runs fn in GPTConfig(fused=True) models inside the block, and only there: outside,
    chapter 04's GPT has no fused kernel and says so."""
    config = dict(vocab_size=31, block_size=16, n_layer=2, n_head=2, n_embd=16)
    torch.manual_seed(0)
    model = GPT(GPTConfig(**config, fused=True))
    idx = torch.randint(0, 31, (2, 16))
    calls = []

    def mine(q, k, v):
        calls.append(q.shape)
        return attention(q, k, v, causal=True)

    with attention_kernel(mine):
        logits, _ = model(idx)
    assert calls == [(2, 2, 16, 8)] * 2
    with pytest.raises(RuntimeError, match="attention_kernel"):
        model(idx)
    with models.running():
        torch.testing.assert_close(model(idx)[0], logits)   # the course's kernel
    assert len(calls) == 2


def test_memory_is_flat_for_fused_and_grows_like_T_squared_for_naive():
    """The fused forward's scratch is its running tasks' tiles whatever T is (how many tasks overlap
    depends on the threads and the machine's load, not on T); naive attention's grows like T^2 (the
    exponent fitted over three sizes: a fixed overhead cannot decide it)."""
    Ts = [256, 512, 1024]
    curve = memory_curve(Ts, H=4, d=64)
    BQ, BK = attention_cpu.FORWARD_TILES
    one_task = 4 * (BQ * 64 + BK * 64 + BQ * BK + BQ * 64 + 2 * BQ)      # queries, V^T, scores, acc, m and l
    assert max(curve["fused"]) < numba.get_num_threads() * one_task + 32 * 1024, (curve["fused"], one_task)
    naive = growth(Ts, curve["naive"])
    assert naive > 1.8, (naive, curve["naive"])                       # O(T^2): the (H, T, T) scores
    assert curve["naive"][-1] > 4 * 1024**2 * 4                       # at least one (4, 1024, 1024) float32 matrix


# ---- the building blocks of course_lib.simd.tiles ----------------------------------------------


@pytest.mark.parametrize("n, m", [(1, 1), (16, 16), (37, 50), (256, 64), (15, 33)])
def test_transpose_in_blocks_equals_numpy(n, m):
    a = np.random.default_rng(n * m).standard_normal((n + 2, m + 3))
    out = np.full((m + 5, n + 4), np.nan)
    transpose(a, out, n, m)
    np.testing.assert_array_equal(out[:m, :n], a[:n, :m].T)
    assert np.isnan(out[m:]).all() and np.isnan(out[:, n:]).all()       # nothing written past the sizes


@pytest.mark.parametrize("n, m, k", [(1, 1, 1), (4, 8, 4), (64, 256, 64), (7, 13, 9), (5, 3, 2), (33, 64, 130)])
@pytest.mark.parametrize("a_t", [False, True])
def test_matmul_equals_numpy(n, m, k, a_t):
    """out (+)= a @ b, or a.T @ b, on the leading rows and columns of bigger buffers, every remainder of 4."""
    g = np.random.default_rng(n * m * k)
    a = g.standard_normal((k + 2, n + 3) if a_t else (n + 2, k + 3))
    b, start = g.standard_normal((k + 1, m + 2)), g.standard_normal((n + 4, m + 5))
    A = a[:k, :n].T if a_t else a[:n, :k]
    for accumulate in (False, True):
        out = start.copy()
        matmul(a, b, out, n, m, k, accumulate, a_t)
        np.testing.assert_allclose(out[:n, :m], A @ b[:k, :m] + (start[:n, :m] if accumulate else 0), rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(out[n:], start[n:])                # nothing written past the sizes
        np.testing.assert_array_equal(out[:, m:], start[:, m:])


def test_row_max_is_the_max_of_the_first_n_and_the_start():
    row = np.random.default_rng(3).standard_normal(29)
    for n in range(-3, 30):
        for start in (-np.inf, 0.5):
            expected = max(start, row[:n].max()) if n > 0 else start
            assert row_max(row, n, start) == expected, (n, start)
