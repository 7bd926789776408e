"""Chapter 12's checks pass on the reference Functions and reject the usual mistakes, including Functions
that give the right numbers but break what a fused op promises: one node, and only what the backward needs
kept on its context."""

import math

import numpy as np
import pytest
from checking import expect_failure, expect_pass

import course_lib.tensor as ct
from course_lib.checks import ch12 as check
from course_lib.tensor import Function, Tensor, no_grad
from course_lib.tensor.tensor_data import TensorData

C, K = math.sqrt(2.0 / math.pi), 0.044715

# ---- references, written as a learner would, with switches for the mistakes ------------------------


def softmax(mistake=None):
    class Softmax(Function):
        @staticmethod
        def forward(ctx, a, dim):
            if mistake == "recorded":
                e = (a - a.max(dim, keepdim=True)).exp()
                ctx.s, ctx.dim = e / e.sum(dim, keepdim=True), dim
                return ctx.s.data
            with no_grad():
                shifted = a if mistake == "no shift" else a - a.max(dim, keepdim=True)
                e = shifted.exp()
                ctx.s, ctx.dim = e / e.sum(mistake == "other dim" and (dim + 1) % a.ndim or dim, keepdim=True), dim
                if mistake == "keeps input":
                    ctx.a = a.detach() * 1.0
            return ctx.s.data

        @staticmethod
        def backward(ctx, grad):
            s = ctx.s
            if mistake == "log-softmax rule":
                return grad - s * grad.sum(ctx.dim, keepdim=True)
            if mistake == "unweighted sum":
                return s * (grad - grad.sum(ctx.dim, keepdim=True))
            return s * (grad - (grad * s).sum(ctx.dim, keepdim=True))
    return Softmax


def gelu(mistake=None):
    class GELU(Function):
        @staticmethod
        def forward(ctx, a):
            with no_grad():
                if mistake == "exact":                  # a * Phi(a), torch's default GELU
                    return a.gelu().data
                u = C * a if mistake == "no cubic" else C * (a + K * a * a * a)
                t = u.tanh()
                ctx.a, ctx.t = a.detach(), t
                if mistake == "keeps three":
                    ctx.u, ctx.a2 = u, a * a
                half = 1.0 if mistake == "no half" else 0.5
                return (half * a * (1.0 + t)).data

        @staticmethod
        def backward(ctx, grad):
            a, t = ctx.a, ctx.t
            if mistake == "no product rule":
                return grad * (0.5 * (1.0 + t))
            du = C * (1.0 + (0.0 if mistake == "no 3ka2" else 3 * K) * a * a)
            dt = (1.0 - t) if mistake == "1 - t" else (1.0 - t * t)
            local = 0.5 * (1.0 + t) + 0.5 * a * dt * du
            return local if mistake == "no upstream" else grad * local
    return GELU


def layer_norm(mistake=None):
    class LayerNorm(Function):
        @staticmethod
        def forward(ctx, a, weight, bias, eps):
            with no_grad():
                n = a.shape[-1]
                centered = a - a.mean(-1, keepdim=True)
                var = (centered * centered).mean(-1, keepdim=True)
                if mistake == "unbiased":
                    var = var * (n / (n - 1))
                eps = 1e-5 if mistake == "fixed eps" else eps
                r = 1.0 / (var.sqrt() + eps) if mistake == "eps outside" else 1.0 / (var + eps).sqrt()
                ctx.xhat, ctx.r, ctx.weight = centered * r, r, weight.detach()
                if mistake == "keeps input":
                    ctx.a, ctx.centered = a.detach(), centered
                out = ctx.xhat * ctx.weight
                return (out if mistake == "no bias" else out + bias).data

        @staticmethod
        def backward(ctx, grad):
            xhat, r, n = ctx.xhat, ctx.r, ctx.xhat.shape[-1]
            g = grad if mistake == "no weight" else grad * ctx.weight
            mean_g, mean_gx = g.mean(-1, keepdim=True), (g * xhat).mean(-1, keepdim=True)
            if mistake == "constant variance":
                d_a = r * (g - mean_g)
            elif mistake == "no mean":
                d_a = r * (g - xhat * mean_gx)
            elif mistake == "no r":
                d_a = g - mean_g - xhat * mean_gx
            elif mistake == "sums":
                d_a = r * (g - g.sum(-1, keepdim=True) - xhat * (g * xhat).sum(-1, keepdim=True))
            else:
                d_a = r * (g - mean_g - xhat * mean_gx)
            rows, x_rows = grad.reshape(-1, n), xhat.reshape(-1, n)
            d_w = rows.sum(0) if mistake == "d_weight sum of grad" else (rows * x_rows).sum(0)
            d_b = (rows * x_rows).sum(0) if mistake == "bias gets xhat" else rows.sum(0)
            return d_a, d_w, d_b
    return LayerNorm


def embedding(mistake=None):
    class Embedding(Function):
        @staticmethod
        def forward(ctx, weight, idx):
            ctx.idx, ctx.rows = idx, weight.shape[0]
            if mistake == "keeps a copy of the table":
                ctx.table = weight.numpy()
            return TensorData.from_numpy(weight.data.to_numpy()[idx], weight.dtype)

        @staticmethod
        def backward(ctx, grad):
            D = grad.shape[-1]
            out = np.zeros((ctx.rows, D))
            idx, rows = ctx.idx.reshape(-1), grad.numpy().reshape(-1, D)
            if mistake == "fancy +=":
                out[idx] += rows
            elif mistake == "assign":
                out[idx] = rows
            elif mistake == "loop overwrites":
                for i, row in zip(idx, rows):
                    out[i] = row
            elif mistake == "mean":
                np.add.at(out, idx, rows)
                out /= np.maximum(np.bincount(idx, minlength=ctx.rows), 1)[:, None]
            else:
                np.add.at(out, idx, rows)
            return Tensor(out, dtype=grad.dtype)
    return Embedding


def masked_fill(mistake=None):
    class MaskedFill(Function):
        @staticmethod
        def forward(ctx, a, mask, value):
            ctx.mask = mask.detach()
            if mistake == "keeps input":
                ctx.a = a.detach() * 1.0
            with no_grad():
                if mistake == "arithmetic":
                    return (a * (1.0 - mask) + mask * value).data
                if mistake == "in place":
                    filled = ct.where(mask, value, a)
                    a.data.storage[:] = filled.data.to_numpy().reshape(-1)[:a.data.storage.size]
                    return filled.data
                keep = (mask == 0.0) if mistake == "inverted" else mask
                return ct.where(keep, value, a).data

        @staticmethod
        def backward(ctx, grad):
            if mistake == "gradient everywhere":
                return grad, None
            if mistake == "backward inverted":
                return ct.where(ctx.mask, grad, 0.0), None
            return ct.where(ctx.mask, 0.0, grad), None
    return MaskedFill


def causal_self_attention(x, c_attn, c_proj, n_head, mistake=None):
    B, T, C = x.shape
    d = C // n_head
    q, k, v = c_attn(x).split(C, dim=2)
    if mistake == "swap qk":
        q, k = k, q
    if mistake == "no transpose":
        q, k, v = (t.reshape(B, n_head, T, d) for t in (q, k, v))
    else:
        q, k, v = (t.reshape(B, T, n_head, d).transpose(1, 2) for t in (q, k, v))
    scale = {"1/d": 1.0 / d, "no scale": 1.0}.get(mistake, 1.0 / math.sqrt(d))
    att = (q @ k.transpose(-2, -1)) * scale
    diagonal = 0 if mistake == "diagonal" else 1
    if mistake not in ("no mask", "mask after softmax"):
        att = att.masked_fill(Tensor(np.triu(np.ones((T, T)), k=diagonal), dtype=x.dtype), float("-inf"))
    att = att.softmax(dim=-2 if mistake == "softmax dim" else -1)
    if mistake == "mask after softmax":
        att = att.masked_fill(Tensor(np.triu(np.ones((T, T)), k=1), dtype=x.dtype), 0.0)
    y = att @ v
    y = y.reshape(B, T, C) if mistake == "no transpose" else y.transpose(1, 2).contiguous().view(B, T, C)
    if mistake == "detached":
        y = Tensor(y.numpy(), dtype=x.dtype)
    return y if mistake == "no proj" else c_proj(y)


# ---- the checks pass on the references -----------------------------------------------------------

CHECKS = {"softmax_function": softmax, "gelu_function": gelu, "layer_norm_function": layer_norm,
          "embedding_function": embedding, "masked_fill_function": masked_fill}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_checks_pass_on_references(name):
    expect_pass(getattr(check, name), CHECKS[name]())


def test_attention_passes_on_the_reference():
    expect_pass(check.causal_self_attention, causal_self_attention)


# ---- and reject wrong ones ------------------------------------------------------------------------

class Stub(Function):
    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError


def _stub(*args, **kwargs):
    raise NotImplementedError


@pytest.mark.parametrize("name", sorted(CHECKS) + ["causal_self_attention"])
def test_stubs_fail(name):
    expect_failure(getattr(check, name), _stub if name == "causal_self_attention" else Stub, match="not implemented yet")


def test_a_function_must_be_a_function_class():
    expect_failure(check.softmax_function, lambda a, dim: a.softmax(dim), match="derived from the library's Function")


@pytest.mark.parametrize("mistake, match", [
    ("no shift", "exp overflowed"),
    ("other dim", "another dim"),
    ("log-softmax rule", "log-softmax's backward"),
    ("unweighted sum", "weigh the gradient by s"),
    ("recorded", "graph of its own"),          # right values, but a dozen nodes kept alive
    ("keeps input", "keeps"),                  # right values, twice the memory
])
def test_softmax_mistakes(mistake, match):
    expect_failure(check.softmax_function, softmax(mistake), match=match)


@pytest.mark.parametrize("mistake, match", [
    ("exact", "exact GELU"),
    ("no cubic", "cubic term is missing"),
    ("no half", "0.5 is missing"),
    ("no product rule", "product rule"),
    ("no 3ka2", "3 k a^2"),
    ("1 - t", "1 - t^2"),
    ("no upstream", "upstream gradient is missing"),
    ("keeps three", "keeps"),                  # right values, more memory than the backward needs
])
def test_gelu_mistakes(mistake, match):
    expect_failure(check.gelu_function, gelu(mistake), match=match)


@pytest.mark.parametrize("mistake, match", [
    ("unbiased", "n - 1"),
    ("eps outside", "inside the square root"),
    ("fixed eps", "eps argument"),
    ("no bias", "bias is missing"),
    ("constant variance", "the variance depends on the input"),
    ("no mean", "the mean of g is missing"),
    ("no weight", "the gain is missing"),
    ("no r", "the factor r"),
    ("sums", "sums instead of means"),
    ("d_weight sum of grad", "sum of grad alone"),
    ("bias gets xhat", "the bias gets the sum of grad"),
    ("keeps input", "keeps"),
])
def test_layer_norm_mistakes(mistake, match):
    expect_failure(check.layer_norm_function, layer_norm(mistake), match=match)


@pytest.mark.parametrize("mistake, match", [
    ("fancy +=", "write each row once"),
    ("assign", "write each row once"),
    ("loop overwrites", "write each row once"),
    ("mean", "the gradient is their sum"),
    ("keeps a copy of the table", "keeps"),
])
def test_embedding_mistakes(mistake, match):
    expect_failure(check.embedding_function, embedding(mistake), match=match)


@pytest.mark.parametrize("mistake, match", [
    ("arithmetic", "gives nan"),
    ("inverted", "the wrong way round"),
    ("in place", "in place"),
    ("gradient everywhere", "got the gradient too"),
    ("backward inverted", "the other way round"),
    ("keeps input", "keeps"),
])
def test_masked_fill_mistakes(mistake, match):
    expect_failure(check.masked_fill_function, masked_fill(mistake), match=match)


@pytest.mark.parametrize("mistake, match", [
    ("no mask", "no causal mask"),
    ("diagonal", "hides the diagonal"),
    ("1/d", "not 1/sqrt(d)"),
    ("no scale", "are not scaled"),
    ("softmax dim", "the wrong dim"),
    ("no transpose", "reshape alone"),
    ("swap qk", "q and k are swapped"),
    ("no proj", "c_proj is missing"),
    ("mask after softmax", "differs"),
    ("detached", "no gradient reached x"),
])
def test_causal_self_attention_mistakes(mistake, match):
    expect_failure(check.causal_self_attention, lambda *a: causal_self_attention(*a, mistake=mistake), match=match)


def test_attention_must_return_a_course_tensor():
    expect_failure(check.causal_self_attention, lambda *a: causal_self_attention(*a).numpy(), match="course Tensor")
