"""Chapter 12: fresh answers (scratch for the audit)."""

import copy
import math
import pickle

import numpy as np
import pytest

import course_lib.tensor as ct
from course_lib.checks import CheckFailed
from course_lib.checks import ch12 as check
from course_lib.gpt.trainer import train_step
from course_lib.tensor import Function, Tensor, nn, no_grad
from course_lib.tensor.tensor_data import TensorData


@pytest.fixture(autouse=True)
def _isolated(workspace):
    """A passing check saves the answer: keep it in a temporary workspace."""


C_GELU, K_GELU = math.sqrt(2.0 / math.pi), 0.044715


# ---------------------------------------------------------------- 1. softmax

class SoftmaxSaved(Function):
    """Correct: the output through save_for_backward, the division as a product, the backward expanded."""

    @staticmethod
    def forward(ctx, a, dim):
        with no_grad():
            shifted = a.detach() - a.detach().max(dim, keepdim=True)
            e = shifted.exp()
            s = e * (1.0 / e.sum(dim, keepdim=True))
        ctx.save_for_backward(s)
        ctx.dim = dim
        return s.data

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        sg = s * grad
        return sg - s * sg.sum(ctx.dim, keepdim=True)


class SoftmaxRecords(Function):
    """Right numbers; the forward's ops are recorded (no no_grad)."""

    @staticmethod
    def forward(ctx, a, dim):
        e = (a - a.max(dim, keepdim=True)).exp()
        ctx.s, ctx.dim = e / e.sum(dim, keepdim=True), dim
        return ctx.s.data

    @staticmethod
    def backward(ctx, grad):
        s = ctx.s.detach()
        return s * (grad - (grad * s).sum(ctx.dim, keepdim=True))


class SoftmaxKeepsExp(Function):
    """Right numbers; keeps the exponentials and the output: two arrays of the input's size."""

    @staticmethod
    def forward(ctx, a, dim):
        with no_grad():
            e = (a - a.max(dim, keepdim=True)).exp()
            z = e.sum(dim, keepdim=True)
            ctx.e, ctx.z, ctx.s, ctx.dim = e, z, e / z, dim
        return ctx.s.data

    @staticmethod
    def backward(ctx, grad):
        s = ctx.s
        return s * (grad - (grad * s).sum(ctx.dim, keepdim=True))


class SoftmaxLogSoftmaxRule(Function):
    """Wrong: the backward of log-softmax."""

    @staticmethod
    def forward(ctx, a, dim):
        with no_grad():
            e = (a - a.max(dim, keepdim=True)).exp()
            ctx.s, ctx.dim = e / e.sum(dim, keepdim=True), dim
        return ctx.s.data

    @staticmethod
    def backward(ctx, grad):
        return grad - ctx.s * grad.sum(ctx.dim, keepdim=True)


class SoftmaxNoShift(Function):
    """Wrong: no max subtracted."""

    @staticmethod
    def forward(ctx, a, dim):
        with no_grad():
            e = a.detach().exp()
            ctx.s, ctx.dim = e / e.sum(dim, keepdim=True), dim
        return ctx.s.data

    @staticmethod
    def backward(ctx, grad):
        s = ctx.s
        return s * (grad - (grad * s).sum(ctx.dim, keepdim=True))


# ---------------------------------------------------------------- 2. GELU

class GELUKeepsTanh(Function):
    """Correct, the tanh form: keeps the input and tanh(u), one array."""

    @staticmethod
    def forward(ctx, a):
        with no_grad():
            x = a.detach()
            t = (C_GELU * (x + K_GELU * x * x * x)).tanh()
            ctx.x, ctx.t = x, t
            return (0.5 * x * (1.0 + t)).data

    @staticmethod
    def backward(ctx, grad):
        x, t = ctx.x, ctx.t
        du = C_GELU * (1.0 + 3.0 * K_GELU * x * x)
        return grad * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)


class GELURecomputes(Function):
    """Correct: keeps only the input and recomputes tanh in the backward."""

    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        with no_grad():
            x = a.detach()
            return (0.5 * x * (1.0 + (C_GELU * (x + K_GELU * x ** 3)).tanh())).data

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        x = a.detach()
        t = (C_GELU * (x + K_GELU * x ** 3)).tanh()
        return grad * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * C_GELU * (1.0 + 3.0 * K_GELU * x * x))


class GELUKeepsEverything(Function):
    """Right numbers; keeps x^2, x^3, u, tanh u and 1 - tanh^2: five arrays."""

    @staticmethod
    def forward(ctx, a):
        with no_grad():
            x = a.detach()
            x2 = x * x
            x3 = x2 * x
            u = C_GELU * (x + K_GELU * x3)
            t = u.tanh()
            sech2 = 1.0 - t * t
            ctx.x, ctx.x2, ctx.x3, ctx.u, ctx.t, ctx.sech2 = x, x2, x3, u, t, sech2
            return (0.5 * x * (1.0 + t)).data

    @staticmethod
    def backward(ctx, grad):
        return grad * (0.5 * (1.0 + ctx.t) + 0.5 * ctx.x * ctx.sech2 * C_GELU * (1.0 + 3.0 * K_GELU * ctx.x2))


class GELURecords(Function):
    """Right numbers; the forward's ops are recorded."""

    @staticmethod
    def forward(ctx, a):
        t = (C_GELU * (a + K_GELU * a * a * a)).tanh()
        ctx.x, ctx.t = a.detach(), t.detach()
        return (0.5 * a * (1.0 + t)).data

    @staticmethod
    def backward(ctx, grad):
        x, t = ctx.x, ctx.t
        return grad * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * C_GELU * (1.0 + 3.0 * K_GELU * x * x))


class GELUHalfOnce(Function):
    """Wrong: the half multiplies only the first term of the product rule."""

    @staticmethod
    def forward(ctx, a):
        with no_grad():
            x = a.detach()
            t = (C_GELU * (x + K_GELU * x * x * x)).tanh()
            ctx.x, ctx.t = x, t
            return (0.5 * x * (1.0 + t)).data

    @staticmethod
    def backward(ctx, grad):
        x, t = ctx.x, ctx.t
        return grad * (0.5 * (1.0 + t) + x * (1.0 - t * t) * C_GELU * (1.0 + 3.0 * K_GELU * x * x))


# ---------------------------------------------------------------- 3. layer norm

class LayerNormCentered(Function):
    """Correct: keeps the centred input and r per row (not x-hat), rebuilds x-hat in the backward."""

    @staticmethod
    def forward(ctx, a, weight, bias, eps):
        with no_grad():
            x = a.detach()
            n = x.shape[-1]
            c = x - x.sum(-1, keepdim=True) * (1.0 / n)
            var = (c * c).sum(-1, keepdim=True) * (1.0 / n)
            r = (var + eps).sqrt() ** -1.0
            ctx.c, ctx.r, ctx.w = c, r, weight.detach()
            return (c * r * ctx.w + bias.detach()).data

    @staticmethod
    def backward(ctx, grad):
        c, r, w = ctx.c, ctx.r, ctx.w
        n = c.shape[-1]
        xhat = c * r
        gx = grad * w
        d_a = (gx * n - gx.sum(-1, keepdim=True) - xhat * (gx * xhat).sum(-1, keepdim=True)) * (r * (1.0 / n))
        flat_g = grad.reshape(-1, n)
        return d_a, (flat_g * xhat.reshape(-1, n)).sum(0), flat_g.sum(0)


class LayerNormKeepsThree(Function):
    """Right numbers; keeps the centred input, x-hat and the normalized output: three arrays."""

    @staticmethod
    def forward(ctx, a, weight, bias, eps):
        with no_grad():
            x = a.detach()
            c = x - x.mean(-1, keepdim=True)
            r = 1.0 / ((c * c).mean(-1, keepdim=True) + eps).sqrt()
            xhat = c * r
            out = xhat * weight.detach() + bias.detach()
            ctx.c, ctx.xhat, ctx.out, ctx.r, ctx.w = c, xhat, out, r, weight.detach()
            return out.data

    @staticmethod
    def backward(ctx, grad):
        xhat, r, n = ctx.xhat, ctx.r, ctx.xhat.shape[-1]
        g = grad * ctx.w
        d_a = r * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
        rows = grad.reshape(-1, n)
        return d_a, (rows * xhat.reshape(-1, n)).sum(0), rows.sum(0)


class LayerNormFixedEps(Function):
    """Wrong: eps fixed at 1e-5."""

    @staticmethod
    def forward(ctx, a, weight, bias, eps):
        with no_grad():
            c = a.detach() - a.detach().mean(-1, keepdim=True)
            r = 1.0 / ((c * c).mean(-1, keepdim=True) + 1e-5).sqrt()
            ctx.xhat, ctx.r, ctx.w = c * r, r, weight.detach()
            return (ctx.xhat * ctx.w + bias.detach()).data

    @staticmethod
    def backward(ctx, grad):
        xhat, r, n = ctx.xhat, ctx.r, ctx.xhat.shape[-1]
        g = grad * ctx.w
        d_a = r * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
        rows = grad.reshape(-1, n)
        return d_a, (rows * xhat.reshape(-1, n)).sum(0), rows.sum(0)


class LayerNormNoMeanPath(Function):
    """Wrong: d_a forgets the path through the mean."""

    @staticmethod
    def forward(ctx, a, weight, bias, eps):
        with no_grad():
            c = a.detach() - a.detach().mean(-1, keepdim=True)
            r = 1.0 / ((c * c).mean(-1, keepdim=True) + eps).sqrt()
            ctx.xhat, ctx.r, ctx.w = c * r, r, weight.detach()
            return (ctx.xhat * ctx.w + bias.detach()).data

    @staticmethod
    def backward(ctx, grad):
        xhat, r, n = ctx.xhat, ctx.r, ctx.xhat.shape[-1]
        g = grad * ctx.w
        d_a = r * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        rows = grad.reshape(-1, n)
        return d_a, (rows * xhat.reshape(-1, n)).sum(0), rows.sum(0)


# ---------------------------------------------------------------- 4. embedding

class EmbeddingBincount(Function):
    """Correct: the scatter-add as one bincount per column."""

    @staticmethod
    def forward(ctx, weight, idx):
        ids = np.asarray(idx)
        ctx.ids, ctx.vocab = ids.reshape(-1), weight.shape[0]
        table = weight.data.to_numpy()
        return TensorData.from_numpy(np.take(table, ids, axis=0), weight.dtype)

    @staticmethod
    def backward(ctx, grad):
        g = grad.data.to_numpy()
        g = g.reshape(-1, g.shape[-1])
        d = np.stack([np.bincount(ctx.ids, weights=g[:, c], minlength=ctx.vocab) for c in range(g.shape[1])], axis=1)
        return Tensor(d.astype(g.dtype), dtype=grad.dtype)


class EmbeddingFancyAdd(Function):
    """Wrong: fancy += counts a repeated id once."""

    @staticmethod
    def forward(ctx, weight, idx):
        ctx.idx, ctx.rows = idx, weight.shape[0]
        return TensorData.from_numpy(weight.data.to_numpy()[idx], weight.dtype)

    @staticmethod
    def backward(ctx, grad):
        D = grad.shape[-1]
        d = np.zeros((ctx.rows, D), dtype=grad.dtype)
        d[ctx.idx.reshape(-1)] += grad.data.to_numpy().reshape(-1, D)
        return Tensor(d, dtype=grad.dtype)


class EmbeddingKeepsTable(Function):
    """Right numbers; keeps the whole table (and the gathered rows) on ctx."""

    @staticmethod
    def forward(ctx, weight, idx):
        ctx.table = weight.data.to_numpy().copy()
        ctx.idx = idx
        ctx.rows_out = ctx.table[idx]
        return TensorData.from_numpy(ctx.rows_out, weight.dtype)

    @staticmethod
    def backward(ctx, grad):
        D = grad.shape[-1]
        d = np.zeros_like(ctx.table)
        np.add.at(d, ctx.idx.reshape(-1), grad.data.to_numpy().reshape(-1, D))
        return Tensor(d, dtype=grad.dtype)


# ---------------------------------------------------------------- 5. masked fill

class MaskedFillEq(Function):
    """Correct: picks with where(mask == 0, a, value); the backward multiplies by 1 - mask."""

    @staticmethod
    def forward(ctx, a, mask, value):
        with no_grad():
            ctx.keep = 1.0 - mask.detach()
            return ct.where(mask.detach() == 0.0, a.detach(), value).data

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.keep, None


class MaskedFillArithmetic(Function):
    """Wrong: fills by arithmetic, a * (1 - mask) + mask * value (-inf * 0 = nan)."""

    @staticmethod
    def forward(ctx, a, mask, value):
        with no_grad():
            ctx.mask = mask.detach()
            return (a.detach() * (1.0 - ctx.mask) + ctx.mask * value).data

    @staticmethod
    def backward(ctx, grad):
        return ct.where(ctx.mask, 0.0, grad), None


class MaskedFillGradEverywhere(Function):
    """Wrong: the gradient reaches the filled places."""

    @staticmethod
    def forward(ctx, a, mask, value):
        with no_grad():
            return ct.where(mask.detach(), value, a.detach()).data

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class MaskedFillRecords(Function):
    """Right numbers; the forward records a where."""

    @staticmethod
    def forward(ctx, a, mask, value):
        ctx.mask = mask.detach()
        return ct.where(mask, value, a).data

    @staticmethod
    def backward(ctx, grad):
        return ct.where(ctx.mask, 0.0, grad), None


# ---------------------------------------------------------------- 6. causal attention

class AttentionAdditiveMask(Function):
    """Correct: the mask as an additive bias of 0 and -inf, the scale folded into q, the inputs saved."""

    @staticmethod
    def forward(ctx, q, k, v):
        T, d = q.shape[-2], q.shape[-1]
        scale = d ** -0.5
        with no_grad():
            q, k, v = q.detach(), k.detach(), v.detach()
            bias = Tensor(np.where(np.tril(np.ones((T, T))) > 0, 0.0, -np.inf), dtype=q.dtype)
            p = ((q * scale) @ k.transpose(-2, -1) + bias).softmax(-1)
            ctx.save_for_backward(q, k, v, p)
            ctx.scale = scale
            return (p @ v).data

    @staticmethod
    def backward(ctx, grad):
        q, k, v, p = ctx.saved_tensors
        dv = p.transpose(-2, -1) @ grad
        dp = grad @ v.transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))
        return (ds @ k) * ctx.scale, (ds.transpose(-2, -1) @ q) * ctx.scale, dv


class AttentionKeepsScores(Function):
    """Right numbers; keeps the scores, the masked scores and the weights: three (B, H, T, T) arrays."""

    @staticmethod
    def forward(ctx, q, k, v):
        T, d = q.shape[-2], q.shape[-1]
        with no_grad():
            q, k, v = q.detach(), k.detach(), v.detach()
            future = Tensor(np.triu(np.ones((T, T)), k=1), dtype=q.dtype)
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            masked = scores.masked_fill(future, float("-inf"))
            p = masked.softmax(-1)
            ctx.q, ctx.k, ctx.v, ctx.scores, ctx.masked, ctx.p = q, k, v, scores, masked, p
            return (p @ v).data

    @staticmethod
    def backward(ctx, grad):
        q, k, v, p = ctx.q, ctx.k, ctx.v, ctx.p
        dp = grad @ v.transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True)) * (1.0 / math.sqrt(q.shape[-1]))
        return ds @ k, ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ grad


class AttentionRecords(Function):
    """Right numbers; the forward's ops recorded."""

    @staticmethod
    def forward(ctx, q, k, v):
        T, d = q.shape[-2], q.shape[-1]
        future = Tensor(np.triu(np.ones((T, T)), k=1), dtype=q.dtype)
        p = ((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))).masked_fill(future, float("-inf")).softmax(-1)
        ctx.q, ctx.k, ctx.v, ctx.p = q.detach(), k.detach(), v.detach(), p.detach()
        return (p @ v).data

    @staticmethod
    def backward(ctx, grad):
        q, k, v, p = ctx.q, ctx.k, ctx.v, ctx.p
        dp = grad @ v.transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True)) * (1.0 / math.sqrt(q.shape[-1]))
        return ds @ k, ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ grad


class AttentionNoScaleBack(Function):
    """Wrong: the scale forgotten in the gradients of q and k."""

    @staticmethod
    def forward(ctx, q, k, v):
        T, d = q.shape[-2], q.shape[-1]
        with no_grad():
            q, k, v = q.detach(), k.detach(), v.detach()
            future = Tensor(np.triu(np.ones((T, T)), k=1), dtype=q.dtype)
            ctx.p = ((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))).masked_fill(future, float("-inf")).softmax(-1)
            ctx.q, ctx.k, ctx.v = q, k, v
            return (ctx.p @ v).data

    @staticmethod
    def backward(ctx, grad):
        q, k, v, p = ctx.q, ctx.k, ctx.v, ctx.p
        dp = grad @ v.transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))
        return ds @ k, ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ grad


# the names the Block and the GPT read
CausalAttention = AttentionAdditiveMask


# ---------------------------------------------------------------- 7. the block

class MLP(nn.Module):
    def __init__(self, config, dtype):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, dtype=dtype)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, dtype=dtype)

    def forward(self, x):
        return self.c_proj(self.c_fc(x).gelu("tanh"))


class CausalSelfAttention(nn.Module):
    """Correct, another layout: one reshape to (B, T, 3, H, hd), one permute, then the three by index."""

    def __init__(self, config, dtype):
        super().__init__()
        if config.n_embd % config.n_head != 0:
            raise ValueError(f"n_head {config.n_head} does not divide n_embd {config.n_embd}")
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, dtype=dtype)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, dtype=dtype)

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        qkv = self.c_attn(x).reshape(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
        y = CausalAttention.apply(qkv[0], qkv[1], qkv[2])
        return self.c_proj(y.permute(0, 2, 1, 3).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, config, dtype):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.attn = CausalSelfAttention(config, dtype)
        self.ln_2 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.mlp = MLP(config, dtype)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class AttentionReshapeBack(nn.Module):
    """Wrong: the heads put back with a reshape alone."""

    def __init__(self, config, dtype):
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError("n_head must divide n_embd")
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, dtype=dtype)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, dtype=dtype)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.reshape(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        return self.c_proj(CausalAttention.apply(q, k, v).reshape(B, T, C))


class BlockReshapeBack(nn.Module):
    def __init__(self, config, dtype):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.attn = AttentionReshapeBack(config, dtype)
        self.ln_2 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.mlp = MLP(config, dtype)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class BlockPostNorm(nn.Module):
    """Wrong: post-norm."""

    def __init__(self, config, dtype):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.attn = CausalSelfAttention(config, dtype)
        self.ln_2 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.mlp = MLP(config, dtype)

    def forward(self, x):
        x = self.ln_1(x + self.attn(x))
        return self.ln_2(x + self.mlp(x))


class AttentionNoGuard(nn.Module):
    """Wrong: no error when n_head does not divide n_embd."""

    def __init__(self, config, dtype):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, dtype=dtype)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, dtype=dtype)

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        qkv = self.c_attn(x).reshape(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
        y = CausalAttention.apply(qkv[0], qkv[1], qkv[2])
        return self.c_proj(y.permute(0, 2, 1, 3).reshape(B, T, C))


class BlockNoGuard(nn.Module):
    def __init__(self, config, dtype):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.attn = AttentionNoGuard(config, dtype)
        self.ln_2 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.mlp = MLP(config, dtype)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class AttentionComposed(nn.Module):
    """Right numbers; attends with the library's recorded ops instead of the one fused op."""

    def __init__(self, config, dtype):
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError("n_head must divide n_embd")
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, dtype=dtype)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, dtype=dtype)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = (t.reshape(B, T, self.n_head, hd).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        future = Tensor(np.triu(np.ones((T, T)), k=1), dtype=x.dtype)
        p = ((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))).masked_fill(future, float("-inf")).softmax(-1)
        return self.c_proj((p @ v).transpose(1, 2).reshape(B, T, C))


class BlockComposed(nn.Module):
    def __init__(self, config, dtype):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.attn = AttentionComposed(config, dtype)
        self.ln_2 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.mlp = MLP(config, dtype)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


# ---------------------------------------------------------------- 8. the GPT

class GPTReverseDraws(nn.Module):
    """Correct: tied the other way round (the embedding takes the head's Parameter), matrices drawn module by
    module, last module first."""

    def __init__(self, config, dtype=np.float32):
        super().__init__()
        self.config = config
        C = config.n_embd
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, C, dtype=dtype),
            wpe=nn.Embedding(config.block_size, C, dtype=dtype),
            h=[Block(config, dtype) for _ in range(config.n_layer)],
            ln_f=nn.LayerNorm(C, dtype=dtype),
        ))
        self.lm_head = nn.Linear(C, config.vocab_size, bias=False, dtype=dtype)
        self.transformer.wte.weight = self.lm_head.weight
        g = ct.generator()
        small = 0.02 / math.sqrt(2 * config.n_layer)
        for name, p in reversed(list(self.named_parameters())):
            if len(p.shape) >= 2:
                std = small if name.endswith("c_proj.weight") else 0.02
                p.copy_(Tensor(g.normal(0.0, std, size=p.shape), dtype=p.dtype))
            elif "ln" in name and name.endswith("weight"):
                p.copy_(Tensor(np.ones(p.shape), dtype=p.dtype))
            else:
                p.copy_(Tensor(np.zeros(p.shape), dtype=p.dtype))

    def forward(self, idx, targets=None):
        idx = np.asarray(idx)
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = np.arange(T)[None, :]
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for blk in self.transformer.h:
            x = blk(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = ct.cross_entropy(logits.reshape(B * T, self.config.vocab_size), np.asarray(targets).reshape(B * T))
        return logits, loss


def make_gpt(untie=False, scale_proj=True, guard=True, zero_bias=True):
    class GPTVariant(nn.Module):
        def __init__(self, config, dtype=np.float32):
            super().__init__()
            self.config = config
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd, dtype=dtype),
                wpe=nn.Embedding(config.block_size, config.n_embd, dtype=dtype),
                h=[Block(config, dtype) for _ in range(config.n_layer)],
                ln_f=nn.LayerNorm(config.n_embd, dtype=dtype),
            ))
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False, dtype=dtype)
            if not untie:
                self.lm_head.weight = self.transformer.wte.weight
            residual_std = 0.02 / math.sqrt(2 * config.n_layer) if scale_proj else 0.02
            for name, p in self.named_parameters():
                if p.ndim == 2:
                    std = residual_std if name.endswith("c_proj.weight") else 0.02
                    p.copy_(Tensor(ct.generator().normal(0.0, std, p.shape), dtype=p.dtype))
                elif name.endswith(".bias") and zero_bias:
                    p.copy_(Tensor(np.zeros(p.shape), dtype=p.dtype))
            if untie:
                self.lm_head.weight.copy_(Tensor(self.transformer.wte.weight.numpy().copy(), dtype=dtype))

        def forward(self, idx, targets=None):
            idx = np.asarray(idx, dtype=np.int64)
            B, T = idx.shape
            if guard and T > self.config.block_size:
                raise ValueError("too long")
            x = self.transformer.wte(idx) + self.transformer.wpe(np.arange(T) % self.config.block_size)
            for block in self.transformer.h:
                x = block(x)
            logits = self.lm_head(self.transformer.ln_f(x))
            if targets is None:
                return logits, None
            return logits, ct.cross_entropy(logits.reshape(B * T, -1), np.asarray(targets, dtype=np.int64).reshape(-1))
    return GPTVariant


# ---------------------------------------------------------------- 9. AdamW

def param_groups_by_len(model, weight_decay):
    decay, plain = [], []
    for p in model.parameters():
        (decay if len(p.shape) >= 2 else plain).append(p)
    return [{"params": plain, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]


class AdamWKeyed:
    """Correct, written differently: state keyed by (group, index), the defaults in a dict, lists in state_dict."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, adam_step):
        params = list(params)
        if params and isinstance(params[0], dict):
            groups = params
        else:
            groups = [{"params": params}]
        self.defaults = {"lr": lr, "weight_decay": weight_decay}
        self.param_groups = []
        for g in groups:
            group = dict(self.defaults)
            group.update({key: val for key, val in g.items() if key != "params"})
            group["params"] = list(g["params"])
            self.param_groups.append(group)
        self.b1, self.b2 = betas
        self.eps = eps
        self.adam_step = adam_step
        self.state = {}

    def zero_grad(self, set_to_none=True):
        for g in self.param_groups:
            for p in g["params"]:
                p.grad = None

    def step(self):
        for gi, g in enumerate(self.param_groups):
            for pi, p in enumerate(g["params"]):
                if p.grad is None:
                    continue
                key = (gi, pi)
                if key not in self.state:
                    self.state[key] = [0, np.zeros_like(p.numpy()), np.zeros_like(p.numpy())]
                st = self.state[key]
                st[0] += 1
                decayed = p.numpy() - g["lr"] * g["weight_decay"] * p.numpy()
                new_p, st[1], st[2] = self.adam_step(decayed, p.grad.numpy(), st[1], st[2], st[0], g["lr"],
                                                     self.b1, self.b2, self.eps)
                p.copy_(Tensor(new_p, dtype=p.dtype))

    def state_dict(self):
        return {"per_param": [[key[0], key[1], st[0], st[1].copy(), st[2].copy()] for key, st in self.state.items()],
                "lr": [g["lr"] for g in self.param_groups],
                "wd": [g["weight_decay"] for g in self.param_groups]}

    def load_state_dict(self, state):
        self.state = {(gi, pi): [t, np.array(m), np.array(v)] for gi, pi, t, m, v in state["per_param"]}
        for g, lr, wd in zip(self.param_groups, state["lr"], state["wd"]):
            g["lr"], g["weight_decay"] = lr, wd


def make_adamw(l2=False, global_step=False, drop_steps=False):
    class AdamWVariant:
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, adam_step):
            groups = list(params)
            if groups and not isinstance(groups[0], dict):
                groups = [{"params": groups}]
            self.param_groups = [{"lr": lr, "weight_decay": weight_decay, **group, "params": list(group["params"])}
                                 for group in groups]
            self.betas, self.eps, self.adam_step = tuple(betas), eps, adam_step
            self.state = {}
            self.t = 0

        def zero_grad(self, set_to_none=True):
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = None

        def step(self):
            b1, b2 = self.betas
            self.t += 1
            place = 0
            for group in self.param_groups:
                lr, decay = group["lr"], group["weight_decay"]
                for p in group["params"]:
                    if p.grad is not None:
                        if place not in self.state:
                            self.state[place] = {"step": 0, "m": np.zeros(p.shape, p.dtype), "v": np.zeros(p.shape, p.dtype)}
                        s = self.state[place]
                        s["step"] += 1
                        t = self.t if global_step else s["step"]
                        if l2:
                            new, s["m"], s["v"] = self.adam_step(p.numpy(), p.grad.numpy() + decay * p.numpy(), s["m"],
                                                                 s["v"], t, lr, b1, b2, self.eps)
                        else:
                            new, s["m"], s["v"] = self.adam_step(p.numpy() * (1 - lr * decay), p.grad.numpy(), s["m"],
                                                                 s["v"], t, lr, b1, b2, self.eps)
                        p.copy_(Tensor(new, dtype=p.dtype))
                    place += 1

        def state_dict(self):
            return {"state": {place: {"step": 0 if drop_steps else s["step"], "m": s["m"].copy(), "v": s["v"].copy()}
                              for place, s in self.state.items()},
                    "t": 0 if drop_steps else self.t,
                    "groups": [{"lr": g["lr"], "weight_decay": g["weight_decay"]} for g in self.param_groups]}

        def load_state_dict(self, state):
            self.state = {place: {"step": s["step"], "m": np.array(s["m"]), "v": np.array(s["v"])}
                          for place, s in state["state"].items()}
            self.t = state["t"]
            for group, options in zip(self.param_groups, state["groups"]):
                group.update(options)
    return AdamWVariant


def param_groups_ok(model, weight_decay):
    params = model.parameters()
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


# ---------------------------------------------------------------- 10. schedule

def lr_at(it, cfg):
    """Correct, with cos^2: 0.5 (1 + cos(pi x)) = cos^2(pi x / 2)."""
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    if it < cfg.warmup_iters:
        return (it + 1) * cfg.lr / cfg.warmup_iters
    x = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * math.cos(math.pi * x / 2) ** 2


def lr_from_zero(it, cfg):                 # wrong: step 0 trains with rate 0
    if it < cfg.warmup_iters:
        return cfg.lr * it / cfg.warmup_iters
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    x = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * x)) * (cfg.lr - cfg.min_lr)


def lr_cosine_from_zero(it, cfg):          # wrong: the cosine's clock starts at step 0
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / cfg.warmup_iters
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    x = it / cfg.lr_decay_iters
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * x)) * (cfg.lr - cfg.min_lr)


def lr_off_by_one(it, cfg):                # wrong: the cosine's phase one step late
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / cfg.warmup_iters
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    x = (it - cfg.warmup_iters + 1) / (cfg.lr_decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * x)) * (cfg.lr - cfg.min_lr)


# ---------------------------------------------------------------- 11. clipping

def clip_via_numpy(params, max_norm):
    """Correct: every gradient flattened into one numpy vector for the norm."""
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        return 0.0
    norm = float(np.linalg.norm(np.concatenate([p.grad.numpy().ravel() for p in with_grad])))
    if norm > max_norm:
        f = max_norm / (norm + 1e-6)
        for p in with_grad:
            p.grad = p.grad * f
    return norm


def clip_per_tensor(params, max_norm):     # wrong property: each tensor clipped by its own norm
    total = 0.0
    for p in params:
        if p.grad is None:
            continue
        n = float((p.grad * p.grad).sum()) ** 0.5
        total += n * n
        if n > max_norm:
            p.grad = p.grad * (max_norm / (n + 1e-6))
    return total ** 0.5


def clip_always(params, max_norm):         # wrong: scales even below the bound
    grads = [p for p in params if p.grad is not None]
    total = math.sqrt(sum(float((p.grad * p.grad).sum()) for p in grads))
    for p in grads:
        p.grad = p.grad * (max_norm / (total + 1e-6))
    return total


def clip_returns_after(params, max_norm):  # wrong: returns the norm after clipping
    grads = [p for p in params if p.grad is not None]
    total = math.sqrt(sum(float((p.grad * p.grad).sum()) for p in grads))
    if total > max_norm:
        for p in grads:
            p.grad = p.grad * (max_norm / (total + 1e-6))
        total = math.sqrt(sum(float((p.grad * p.grad).sum()) for p in grads))
    return total


def clip_no_epsilon(params, max_norm):     # plausible: max_norm / norm, not torch's max_norm / (norm + 1e-6)
    grads = [p for p in params if p.grad is not None]
    total = math.sqrt(sum(float((p.grad * p.grad).sum()) for p in grads))
    if total > max_norm:
        for p in grads:
            p.grad = p.grad * (max_norm / total)
    return total


# ---------------------------------------------------------------- 12. checkpoints

def save_checkpoint(path, it, model, optimizer, batches):
    """Correct, another way: a tuple, and the whole Generator object pickled."""
    with open(path, "wb") as f:
        pickle.dump((it, model.state_dict(), optimizer.state_dict(), copy.deepcopy(batches.rng)), f)


def load_checkpoint(path, model, optimizer, batches):
    with open(path, "rb") as f:
        it, weights, opt_state, rng = pickle.load(f)
    model.load_state_dict(weights)
    optimizer.load_state_dict(opt_state)
    batches.rng = rng
    return it


def save_no_rng(path, it, model, optimizer, batches):        # wrong: the draws' state is lost
    with open(path, "wb") as f:
        pickle.dump({"it": it, "model": model.state_dict(), "opt": optimizer.state_dict()}, f)


def load_no_rng(path, model, optimizer, batches):
    with open(path, "rb") as f:
        s = pickle.load(f)
    model.load_state_dict(s["model"])
    optimizer.load_state_dict(s["opt"])
    return s["it"]


def save_no_optimizer(path, it, model, optimizer, batches):  # wrong: the optimizer's state is lost
    with open(path, "wb") as f:
        pickle.dump({"it": it, "model": model.state_dict(), "rng": batches.rng.bit_generator.state}, f)


def load_no_optimizer(path, model, optimizer, batches):
    with open(path, "rb") as f:
        s = pickle.load(f)
    model.load_state_dict(s["model"])
    batches.rng.bit_generator.state = s["rng"]
    return s["it"]


# ---------------------------------------------------------------- 13. the loop

def train_while(model, optimizer, batches, cfg, lib, checkpoint=None, save_every=0, resume=False):
    """Correct, a while loop and an evaluation helper that returns its two means."""
    hist = dict(iter=[], lr=[], loss=[], eval_iter=[], train_loss=[], val_loss=[])

    def mean_loss(split):
        total = 0.0
        for _ in range(cfg.eval_iters):
            x, y = batches.get(split)
            total += float(model(x, y)[1])
        return total / cfg.eval_iters

    def evaluate(at):
        model.eval()
        with lib.no_grad():
            tr = mean_loss("train")
            va = mean_loss("val")
        model.train()
        hist["eval_iter"].append(at)
        hist["train_loss"].append(tr)
        hist["val_loss"].append(va)

    step = 0
    if resume:
        step = load_checkpoint(checkpoint, model, optimizer, batches)
    model.train()
    while step < cfg.max_iters:
        if cfg.eval_interval and step % cfg.eval_interval == 0:
            evaluate(step)
        rate = lr_at(step, cfg)
        for g in optimizer.param_groups:
            g["lr"] = rate
        x, y = batches.get("train")
        loss = train_step(model, optimizer, x, y, cfg.grad_clip, lib)
        hist["iter"].append(step)
        hist["lr"].append(rate)
        hist["loss"].append(float(loss))
        step += 1
        if checkpoint and save_every and step % save_every == 0:
            save_checkpoint(checkpoint, step, model, optimizer, batches)
    evaluate(cfg.max_iters)
    return hist


def make_train(save_after_eval=False, forget_resume_step=False, no_final_eval=False):
    def train(model, optimizer, batches, cfg, lib, checkpoint=None, save_every=0, resume=False):
        history = {key: [] for key in ("iter", "lr", "loss", "eval_iter", "train_loss", "val_loss")}

        def evaluate(it):
            model.eval()
            with lib.no_grad():
                for split in ("train", "val"):
                    losses = [float(model(*batches.get(split))[1]) for _ in range(cfg.eval_iters)]
                    history[f"{split}_loss"].append(sum(losses) / len(losses))
            model.train()
            history["eval_iter"].append(it)

        first = load_checkpoint(checkpoint, model, optimizer, batches) if resume else 0
        if forget_resume_step:
            first = 0
        model.train()
        for it in range(first, cfg.max_iters):
            if cfg.eval_interval and it % cfg.eval_interval == 0:
                evaluate(it)
            if save_after_eval and checkpoint is not None and save_every and it != first and it % save_every == 0:
                save_checkpoint(checkpoint, it, model, optimizer, batches)      # after this step's evaluation drew
            lr = lr_at(it, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, y = batches.get("train")
            loss = float(train_step(model, optimizer, x, y, cfg.grad_clip, lib))
            for key, value in (("iter", it), ("lr", lr), ("loss", loss)):
                history[key].append(value)
            if not save_after_eval and checkpoint is not None and save_every and (it + 1) % save_every == 0:
                save_checkpoint(checkpoint, it + 1, model, optimizer, batches)
        if save_after_eval and checkpoint is not None and save_every and cfg.max_iters % save_every == 0:
            save_checkpoint(checkpoint, cfg.max_iters, model, optimizer, batches)
        if not no_final_eval:
            evaluate(cfg.max_iters)
        return history
    return train


# ---------------------------------------------------------------- 14. sampling

def generate_partition(model, idx, max_new_tokens, temperature, top_k, draw):
    """Correct: np.partition for the k-th largest, the window cut by a start index."""
    model.eval()
    ids = np.array(idx, dtype=np.int64)
    bs = model.config.block_size
    for _ in range(max_new_tokens):
        window = ids[:, max(0, ids.shape[1] - bs):]
        with no_grad():
            logits = model(window)[0]
        z = logits.numpy()[:, -1, :] / temperature
        if top_k is not None and top_k < z.shape[1]:
            kth = np.partition(z, z.shape[1] - top_k, axis=1)[:, z.shape[1] - top_k][:, None]
            z = np.where(z >= kth, z, -np.inf)
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p = p / p.sum(axis=1, keepdims=True)
        nxt = np.asarray(draw(p), dtype=np.int64).reshape(-1, 1)
        ids = np.concatenate([ids, nxt], axis=1)
    return ids


def generate_power(model, idx, max_new_tokens, temperature, top_k, draw):
    """Correct: softmax first, then the temperature as a power (p^(1/T), renormalised: the same distribution)."""
    model.eval()
    ids = np.array(idx, dtype=np.int64)
    for _ in range(max_new_tokens):
        with no_grad():
            logits = model(ids[:, -model.config.block_size:])[0].numpy()[:, -1, :]
        if top_k is not None and top_k < logits.shape[1]:
            kth = np.sort(logits, axis=1)[:, -top_k][:, None]
            logits = np.where(logits < kth, -np.inf, logits)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p = p ** (1.0 / temperature)
        p /= p.sum(axis=1, keepdims=True)
        ids = np.concatenate([ids, np.asarray(draw(p), dtype=np.int64)[:, None]], axis=1)
    return ids


def make_generate(crop=True, grad_off=True, eval_mode=True):
    def generate(model, idx, max_new_tokens, temperature, top_k, draw):
        if eval_mode:
            model.eval()
        idx = np.asarray(idx, dtype=np.int64)
        for _ in range(max_new_tokens):
            window = idx[:, -model.config.block_size:] if crop else idx
            if grad_off:
                with no_grad():
                    logits, _ = model(window)
            else:
                logits, _ = model(window)
            last = logits.numpy()[:, -1, :] / temperature
            if top_k is not None and top_k < last.shape[-1]:
                kth = np.sort(last, axis=-1)[:, -top_k, None]
                last = np.where(last < kth, -np.inf, last)
            probs = np.exp(last - last.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            idx = np.concatenate([idx, np.asarray(draw(probs), dtype=np.int64).reshape(-1, 1)], axis=1)
        return idx
    return generate


# ---------------------------------------------------------------- the cases

ACCEPT = [
    ("softmax", lambda: check.softmax_function(SoftmaxSaved)),
    ("gelu_tanh", lambda: check.gelu_function(GELUKeepsTanh)),
    ("gelu_recompute", lambda: check.gelu_function(GELURecomputes)),
    ("layer_norm", lambda: check.layer_norm_function(LayerNormCentered)),
    ("embedding", lambda: check.embedding_function(EmbeddingBincount)),
    ("masked_fill", lambda: check.masked_fill_function(MaskedFillEq)),
    ("attention", lambda: check.attention_function(AttentionAdditiveMask)),
    ("block", lambda: check.block(Block)),
    ("gpt", lambda: check.gpt(GPTReverseDraws)),
    ("adamw", lambda: check.adamw(param_groups_by_len, AdamWKeyed)),
    ("lr_schedule", lambda: check.lr_schedule(lr_at)),
    ("clip", lambda: check.clip_grad_norm(clip_via_numpy)),
    ("checkpoint", lambda: check.checkpoint(save_checkpoint, load_checkpoint)),
    ("train", lambda: check.train(train_while)),
    ("generate_partition", lambda: check.generate(generate_partition)),
    ("generate_power", lambda: check.generate(generate_power)),
]

REJECT = [
    ("softmax_records", lambda: check.softmax_function(SoftmaxRecords)),
    ("softmax_keeps_exp", lambda: check.softmax_function(SoftmaxKeepsExp)),
    ("softmax_logsoftmax_rule", lambda: check.softmax_function(SoftmaxLogSoftmaxRule)),
    ("softmax_no_shift", lambda: check.softmax_function(SoftmaxNoShift)),
    ("gelu_keeps_everything", lambda: check.gelu_function(GELUKeepsEverything)),
    ("gelu_records", lambda: check.gelu_function(GELURecords)),
    ("gelu_half_once", lambda: check.gelu_function(GELUHalfOnce)),
    ("layer_norm_keeps_three", lambda: check.layer_norm_function(LayerNormKeepsThree)),
    ("layer_norm_fixed_eps", lambda: check.layer_norm_function(LayerNormFixedEps)),
    ("layer_norm_no_mean_path", lambda: check.layer_norm_function(LayerNormNoMeanPath)),
    ("embedding_fancy_add", lambda: check.embedding_function(EmbeddingFancyAdd)),
    ("embedding_keeps_table", lambda: check.embedding_function(EmbeddingKeepsTable)),
    ("masked_fill_arithmetic", lambda: check.masked_fill_function(MaskedFillArithmetic)),
    ("masked_fill_grad_everywhere", lambda: check.masked_fill_function(MaskedFillGradEverywhere)),
    ("masked_fill_records", lambda: check.masked_fill_function(MaskedFillRecords)),
    ("attention_keeps_scores", lambda: check.attention_function(AttentionKeepsScores)),
    ("attention_records", lambda: check.attention_function(AttentionRecords)),
    ("attention_no_scale_back", lambda: check.attention_function(AttentionNoScaleBack)),
    ("block_reshape_back", lambda: check.block(BlockReshapeBack)),
    ("block_post_norm", lambda: check.block(BlockPostNorm)),
    ("block_no_guard", lambda: check.block(BlockNoGuard)),
    ("block_composed_attention", lambda: check.block(BlockComposed)),
    ("gpt_untied", lambda: check.gpt(make_gpt(untie=True))),
    ("gpt_proj_unscaled", lambda: check.gpt(make_gpt(scale_proj=False))),
    ("gpt_no_length_guard", lambda: check.gpt(make_gpt(guard=False))),
    ("gpt_bias_not_zeroed", lambda: check.gpt(make_gpt(zero_bias=False))),
    ("adamw_l2", lambda: check.adamw(param_groups_ok, make_adamw(l2=True))),
    ("adamw_global_step", lambda: check.adamw(param_groups_ok, make_adamw(global_step=True))),
    ("adamw_state_loses_steps", lambda: check.adamw(param_groups_ok, make_adamw(drop_steps=True))),
    ("lr_from_zero", lambda: check.lr_schedule(lr_from_zero)),
    ("lr_cosine_from_zero", lambda: check.lr_schedule(lr_cosine_from_zero)),
    ("lr_off_by_one", lambda: check.lr_schedule(lr_off_by_one)),
    ("clip_per_tensor", lambda: check.clip_grad_norm(clip_per_tensor)),
    ("clip_always", lambda: check.clip_grad_norm(clip_always)),
    ("clip_returns_after", lambda: check.clip_grad_norm(clip_returns_after)),
    ("clip_no_epsilon", lambda: check.clip_grad_norm(clip_no_epsilon)),
    ("checkpoint_no_rng", lambda: check.checkpoint(save_no_rng, load_no_rng)),
    ("checkpoint_no_optimizer", lambda: check.checkpoint(save_no_optimizer, load_no_optimizer)),
    ("train_saves_after_eval", lambda: check.train(make_train(save_after_eval=True))),
    ("train_forgets_resume_step", lambda: check.train(make_train(forget_resume_step=True))),
    ("train_no_final_eval", lambda: check.train(make_train(no_final_eval=True))),
    ("generate_no_crop", lambda: check.generate(make_generate(crop=False))),
    ("generate_records", lambda: check.generate(make_generate(grad_off=False))),
    ("generate_train_mode", lambda: check.generate(make_generate(eval_mode=False))),
]


@pytest.mark.parametrize("name, run", ACCEPT, ids=[c[0] for c in ACCEPT])
def test_accept(name, run):
    run()


@pytest.mark.parametrize("name, run", REJECT, ids=[c[0] for c in REJECT])
def test_reject(name, run):
    with pytest.raises(CheckFailed) as info:
        run()
    print(str(info.value)[:800])
