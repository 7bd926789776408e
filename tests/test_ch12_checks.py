"""Chapter 12's checks pass on the course's answers and on correct answers written differently, and reject the
usual mistakes, including answers that give the right numbers but break what the piece promises: a fused
op that records its steps or keeps too much; decay on the norms; a schedule one step off; clipping per
tensor; the residual added after the norm; an untied head; a resume that loses the optimizer's moments or
the batches' draws."""

import math
import pickle

import numpy as np
import pytest
from checking import expect_failure, expect_pass

import course_lib.tensor as ct
from course_lib.capstone import functions as answers
from course_lib.capstone import model as answer_model
from course_lib.capstone import optim as answer_optim
from course_lib.capstone import sample as answer_sample
from course_lib.capstone import train as answer_train
from course_lib.checks import ch12 as check
from course_lib.gpt.trainer import train_step
from course_lib.tensor import Function, Tensor, nn, no_grad
from course_lib.tensor.tensor_data import TensorData

C, K = math.sqrt(2.0 / math.pi), 0.044715


class Stub(Function):
    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError


def _stub(*args, **kwargs):
    raise NotImplementedError


class StubModule(nn.Module):
    def __init__(self, *args, **kwargs):
        raise NotImplementedError


# ---- 1. softmax -------------------------------------------------------------------------------------

def softmax(mistake=None):
    class Softmax(Function):
        @staticmethod
        def forward(ctx, a, dim):
            if mistake == "recorded":                     # right values, every step a node of its own
                e = (a - a.max(dim, keepdim=True)).exp()
                ctx.s, ctx.dim = (e / e.sum(dim, keepdim=True)).detach(), dim
                return ctx.s.data
            with no_grad():
                shifted = a if mistake == "no shift" else a - a.max(dim, keepdim=True)
                e = shifted.exp()
                ctx.s, ctx.dim = e / e.sum(mistake == "other dim" and (dim + 1) % a.ndim or dim, keepdim=True), dim
                if mistake == "keeps exp":                # right values, twice what the backward needs
                    ctx.e = e
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


class SoftmaxFromLogSumExp(Function):
    """Correct, written otherwise: keeps the input and its log-sum-exp, and makes s again in the backward."""

    @staticmethod
    def forward(ctx, a, dim):
        with no_grad():
            m = a.max(dim, keepdim=True)
            lse = m + (a - m).exp().sum(dim, keepdim=True).log()
            ctx.a, ctx.lse, ctx.dim = a.detach(), lse, dim
            return (a - lse).exp().data

    @staticmethod
    def backward(ctx, grad):
        s = (ctx.a - ctx.lse).exp()
        return s * grad - s * (s * grad).sum(ctx.dim, keepdim=True)


@pytest.mark.parametrize("mistake, match", [
    ("no shift", "exp overflowed"),
    ("other dim", "another dim"),
    ("log-softmax rule", "backward of log-softmax"),
    ("unweighted sum", "weigh each entry's gradient"),
    ("recorded", "recorded"),
    ("keeps exp", "keeps"),
])
def test_softmax_mistakes(mistake, match):
    expect_failure(check.softmax_function, softmax(mistake), match=match)


# ---- 2. GELU ----------------------------------------------------------------------------------------

def gelu(mistake=None):
    class GELU(Function):
        @staticmethod
        def forward(ctx, a):
            if mistake == "detached copies":              # autograd on, only detached values kept (#48)
                t = (C * (a + K * a * a * a)).tanh()
                ctx.a, ctx.t = a.detach(), t.detach()
                return (0.5 * a * (1.0 + t)).data
            with no_grad():
                if mistake == "exact":                    # a * Phi(a), torch's default GELU
                    return a.gelu().data
                u = C * a if mistake == "no cubic" else C * (a + K * a * a * a)
                t = u.tanh()
                ctx.a, ctx.t = a.detach(), t
                if mistake == "keeps every step":
                    ctx.u, ctx.a2, ctx.a3 = u, a * a, a * a * a
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


class GELUSigmoid(Function):
    """Correct, written otherwise: a * sigmoid(2u), keeping a, a^2 and the sigmoid (the library's old GELUTanh,
    which the former budget of two arrays refused)."""

    @staticmethod
    def forward(ctx, a):
        with no_grad():
            a = a.detach()
            a2 = a * a
            s = ((a2 * (2 * C * K) + 2 * C) * a).sigmoid()
            ctx.a, ctx.a2, ctx.s = a, a2, s
            return (a * s).data

    @staticmethod
    def backward(ctx, grad):
        a, a2, s = ctx.a, ctx.a2, ctx.s
        return grad * (s + s * (1.0 - s) * (a2 * (6 * C * K) + 2 * C) * a)


@pytest.mark.parametrize("mistake, match", [
    ("exact", "exact GELU"),
    ("no cubic", "cubic inside the tanh"),
    ("no half", "one half is missing"),
    ("no product rule", "product rule"),
    ("no 3ka2", "cubic's own derivative"),
    ("1 - t", "tanh's derivative"),
    ("no upstream", "upstream gradient is missing"),
    ("keeps every step", "keeps"),
    ("detached copies", "recorded"),
])
def test_gelu_mistakes(mistake, match):
    expect_failure(check.gelu_function, gelu(mistake), match=match)


# ---- 3. layer norm -------------------------------------------------------------------------------------

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
                if mistake == "keeps centered":
                    ctx.centered = centered
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


class LayerNormFromMoments(Function):
    """Correct, written otherwise: keeps the input, its mean and 1/std per row (torch's way), and makes xhat
    again in the backward, whose d_a is written with sums divided by n."""

    @staticmethod
    def forward(ctx, a, weight, bias, eps):
        with no_grad():
            mean = a.mean(-1, keepdim=True)
            rstd = ((a - mean) ** 2.0).mean(-1, keepdim=True).__add__(eps) ** -0.5
            ctx.a, ctx.mean, ctx.rstd, ctx.w = a.detach(), mean, rstd, weight.detach()
            return ((a - mean) * rstd * weight + bias).data

    @staticmethod
    def backward(ctx, grad):
        n = ctx.a.shape[-1]
        xhat = (ctx.a - ctx.mean) * ctx.rstd
        g = grad * ctx.w
        d_a = (g * n - g.sum(-1, keepdim=True) - xhat * (g * xhat).sum(-1, keepdim=True)) * (ctx.rstd / n)
        flat = grad.reshape(-1, n)
        return d_a, (flat * xhat.reshape(-1, n)).sum(0), flat.sum(0)


@pytest.mark.parametrize("mistake, match", [
    ("unbiased", "n - 1"),
    ("eps outside", "under the square root"),
    ("fixed eps", "other values than 1e-5"),
    ("no bias", "bias is missing"),
    ("constant variance", "the variance depends on the input"),
    ("no mean", "the mean that is subtracted"),
    ("no weight", "the gain is missing"),
    ("no r", "scaling by r"),
    ("sums", "sums instead of means"),
    ("d_weight sum of grad", "that is the bias's gradient"),
    ("bias gets xhat", "that is the gain's gradient"),
    ("keeps centered", "keeps"),
])
def test_layer_norm_mistakes(mistake, match):
    expect_failure(check.layer_norm_function, layer_norm(mistake), match=match)


# ---- 4. embedding ----------------------------------------------------------------------------------------

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
            elif mistake == "mean":
                np.add.at(out, idx, rows)
                out /= np.maximum(np.bincount(idx, minlength=ctx.rows), 1)[:, None]
            else:
                np.add.at(out, idx, rows)
            return Tensor(out, dtype=grad.dtype)
    return Embedding


class EmbeddingByCounts(Function):
    """Correct, written otherwise: np.take forward; a backward that adds the rows with a one-hot product."""

    @staticmethod
    def forward(ctx, weight, idx):
        ctx.idx, ctx.V = np.asarray(idx).reshape(-1), weight.shape[0]
        return TensorData.from_numpy(np.take(weight.numpy(), idx, axis=0), weight.dtype)

    @staticmethod
    def backward(ctx, grad):
        one_hot = np.eye(ctx.V)[ctx.idx]                      # (positions, V), built here, not kept
        return Tensor(one_hot.T @ grad.numpy().reshape(len(ctx.idx), -1), dtype=grad.dtype)


@pytest.mark.parametrize("mistake, match", [
    ("fancy +=", "write each row once"),
    ("assign", "write each row once"),
    ("mean", "the gradient is their sum"),
    ("keeps a copy of the table", "keeps"),
])
def test_embedding_mistakes(mistake, match):
    expect_failure(check.embedding_function, embedding(mistake), match=match)


# ---- 5. masked fill -------------------------------------------------------------------------------------

def masked_fill(mistake=None):
    class MaskedFill(Function):
        @staticmethod
        def forward(ctx, a, mask, value):
            ctx.mask = mask.detach()
            if mistake == "keeps a copy":
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


class MaskedFillKept(Function):
    """Correct, written otherwise: picks with the mask the other way round; the backward multiplies (grad is finite)."""

    @staticmethod
    def forward(ctx, a, mask, value):
        ctx.keep = 1.0 - mask.detach()
        with no_grad():
            return ct.where(ctx.keep, a, value).data

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.keep, None


@pytest.mark.parametrize("mistake, match", [
    ("arithmetic", "gives nan"),
    ("inverted", "the wrong way round"),
    ("in place", "in place"),
    ("gradient everywhere", "got the gradient too"),
    ("backward inverted", "the other way round"),
    ("keeps a copy", "keeps"),
])
def test_masked_fill_mistakes(mistake, match):
    expect_failure(check.masked_fill_function, masked_fill(mistake), match=match)


# ---- 6. causal attention ---------------------------------------------------------------------------------

def attention(mistake=None):
    class CausalAttention(Function):
        @staticmethod
        def forward(ctx, q, k, v):
            T, d = q.shape[-2], q.shape[-1]
            scale = {"1/d": 1.0 / d, "no scale": 1.0}.get(mistake, 1.0 / math.sqrt(d))
            diagonal = 0 if mistake == "diagonal" else 1
            future = Tensor(np.triu(np.ones((T, T)), k=diagonal), dtype=q.dtype)
            if mistake == "recorded":
                p = ((q @ k.transpose(-2, -1)) * scale).masked_fill(future, float("-inf")).softmax(-1)
                ctx.q, ctx.k, ctx.v, ctx.p = q.detach(), k.detach(), v.detach(), p.detach()
                return (p @ v).data
            with no_grad():
                q, k, v = q.detach(), k.detach(), v.detach()
                if mistake == "swap qk":
                    q, k = k, q
                scores = (q @ k.transpose(-2, -1)) * scale
                if mistake != "no mask":
                    scores = scores.masked_fill(future, float("-inf"))
                p = scores.softmax(-2 if mistake == "softmax dim" else -1)
                ctx.q, ctx.k, ctx.v, ctx.p = q, k, v, p
                if mistake == "keeps the scores":
                    ctx.scores = scores
                return (p @ v).data

        @staticmethod
        def backward(ctx, grad):
            q, k, v, p = ctx.q, ctx.k, ctx.v, ctx.p
            scale = 1.0 / math.sqrt(q.shape[-1])
            dp = grad @ v.transpose(-2, -1)
            if mistake == "unweighted softmax":
                ds = p * dp * scale
            else:
                ds = p * (dp - (dp * p).sum(-1, keepdim=True)) * (1.0 if mistake == "no scale back" else scale)
            dv = p @ grad if mistake == "dv untransposed" else p.transpose(-2, -1) @ grad
            return ds @ k, ds.transpose(-2, -1) @ q, dv
    return CausalAttention


class FlashStyleAttention(Function):
    """Correct, written otherwise: keeps q, k, v, the output and each query's log-sum-exp (no weights), and
    makes the weights again in the backward; the mask is an added bias of -inf."""

    @staticmethod
    def forward(ctx, q, k, v):
        T, d = q.shape[-2], q.shape[-1]
        with no_grad():
            bias = Tensor(np.where(np.triu(np.ones((T, T)), 1) > 0, -np.inf, 0.0), dtype=q.dtype)
            s = q @ k.transpose(-2, -1) / math.sqrt(d) + bias
            m = s.max(-1, keepdim=True)
            lse = m + (s - m).exp().sum(-1, keepdim=True).log()
            out = (s - lse).exp() @ v
            ctx.saved_qkv, ctx.out, ctx.lse = (q.detach(), k.detach(), v.detach()), out, lse
            return out.data

    @staticmethod
    def backward(ctx, grad):
        q, k, v = ctx.saved_qkv
        T, d = q.shape[-2], q.shape[-1]
        bias = Tensor(np.where(np.triu(np.ones((T, T)), 1) > 0, -np.inf, 0.0), dtype=q.dtype)
        p = ((q @ k.transpose(-2, -1)) / math.sqrt(d) + bias - ctx.lse).exp()
        dp = grad @ v.transpose(-2, -1)
        row = (grad * ctx.out).sum(-1, keepdim=True)                  # rowsum(dp * p), as FlashAttention 2 does
        ds = p * (dp - row) / math.sqrt(d)
        return ds @ k, ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ grad


@pytest.mark.parametrize("mistake, match", [
    ("no mask", "no causal mask"),
    ("diagonal", "hides the diagonal"),
    ("1/d", "not 1/sqrt(d)"),
    ("no scale", "not scaled"),
    ("softmax dim", "wrong dim"),
    ("swap qk", "q and k are swapped"),
    ("no scale back", "scale is missing"),
    ("unweighted softmax", "weighted row sum"),
    ("dv untransposed", "weights transposed"),
    ("recorded", "recorded"),
    ("keeps the scores", "keeps"),
])
def test_attention_mistakes(mistake, match):
    expect_failure(check.attention_function, attention(mistake), match=match)


# ---- 7. the block ------------------------------------------------------------------------------------------

def block(mistake=None):
    class MLP(nn.Module):
        def __init__(self, config, dtype):
            super().__init__()
            self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, dtype=dtype)
            self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, dtype=dtype)

        def forward(self, x):
            return self.c_proj(self.c_fc(x).gelu("none" if mistake == "exact gelu" else "tanh"))

    class Attention(nn.Module):
        def __init__(self, config, dtype):
            super().__init__()
            if config.n_embd % config.n_head and mistake != "no refusal":
                if mistake == "silent refusal":
                    raise AssertionError()
                raise ValueError("n_head must divide n_embd")
            self.n_head = config.n_head
            self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, dtype=dtype)
            self.c_proj = nn.Linear(config.n_embd, config.n_embd, dtype=dtype)

        def forward(self, x):
            B, T, C = x.shape
            H = self.n_head
            q, k, v = (t.reshape(B, T, H, C // H).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
            y = answers.CausalAttention.apply(q, k, v)
            y = y.reshape(B, T, C) if mistake == "merge by reshape" else y.transpose(1, 2).reshape(B, T, C)
            return self.c_proj(y)

    class Block(nn.Module):
        def __init__(self, config, dtype):
            super().__init__()
            dtype = np.float32 if mistake == "float32" else dtype
            self.ln_1 = nn.LayerNorm(config.n_embd, dtype=dtype)
            self.attn = Attention(config, dtype)
            self.ln_2 = nn.LayerNorm(config.n_embd, dtype=dtype)
            self.mlp = MLP(config, dtype)

        def forward(self, x):
            if mistake == "post-norm":                        # the residual added, then the norm
                x = self.ln_1(x + self.attn(x))
                return self.ln_2(x + self.mlp(x))
            x = x + self.attn(self.ln_1(x))
            return (self.mlp(self.ln_2(x))) if mistake == "no residual" else x + self.mlp(self.ln_2(x))
    return Block


@pytest.mark.parametrize("mistake, match", [
    ("post-norm", "post-norm"),
    ("exact gelu", "exact one"),
    ("no residual", "residual of the MLP"),
    ("merge by reshape", "differs"),
    ("no refusal", "was built with n_embd = 10"),
    ("silent refusal", "says nothing"),
    ("float32", "dtype"),
])
def test_block_mistakes(mistake, match):
    expect_failure(check.block, block(mistake), match=match)


def test_a_block_must_keep_chapter_04s_names():
    class Renamed(answer_model.Block):
        def __init__(self, config, dtype):
            super().__init__(config, dtype)
            self.norm1 = self.ln_1
            del self.ln_1

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.ln_2(x))
    expect_failure(check.block, Renamed, match="not named as chapter 04's")


# ---- 8. the GPT ---------------------------------------------------------------------------------------------

def gpt(mistake=None):
    class GPT(answer_model.GPT):
        def __init__(self, config, dtype=np.float32):
            super().__init__(config, dtype)
            if mistake == "untied head":                       # right values, two matrices from then on
                self.lm_head.weight = nn.Parameter(self.transformer.wte.weight.numpy(), dtype=dtype)
            if mistake == "no residual scaling":
                for name, p in self.named_parameters():
                    if name.endswith("c_proj.weight"):
                        p.copy_(Tensor(ct.generator().normal(0.0, 0.02, p.shape), dtype=p.dtype))
            if mistake == "library's embedding init":
                self.transformer.wpe.weight.copy_(Tensor(ct.generator().normal(0.0, 1.0, (config.block_size,
                                                                                        config.n_embd)), dtype=dtype))

        def forward(self, idx, targets=None):
            idx = np.asarray(idx)
            if mistake == "no length check" and idx.shape[1] > self.config.block_size:
                idx = idx[:, -self.config.block_size:]
            if mistake == "no positions":
                x = self.transformer.wte(idx)
                for b in self.transformer.h:
                    x = b(x)
                logits = self.lm_head(self.transformer.ln_f(x))
                loss = None if targets is None else ct.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                                      np.asarray(targets).reshape(-1))
                return logits, loss
            return super().forward(idx, targets)
    return GPT


@pytest.mark.parametrize("mistake, match", [
    ("untied head", "not tied"),
    ("no residual scaling", "c_proj"),
    ("library's embedding init", "standard deviation"),
    ("no positions", "logits"),
    ("no length check", "block_size"),
])
def test_gpt_mistakes(mistake, match):
    expect_failure(check.gpt, gpt(mistake), match=match)


class GPTTiedAfter(nn.Module):
    """Correct, written otherwise: the initialisation walks the modules, the head is tied after it, and the
    loss is computed by hand from the library's log_softmax."""

    def __init__(self, config, dtype=np.float32):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd, dtype=dtype),
            wpe=nn.Embedding(config.block_size, config.n_embd, dtype=dtype),
            h=[answer_model.Block(config, dtype) for _ in range(config.n_layer)],
            ln_f=nn.LayerNorm(config.n_embd, dtype=dtype)))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False, dtype=dtype)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.copy_(Tensor(ct.generator().normal(0.0, 0.02, module.weight.shape), dtype=dtype))
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.copy_(Tensor(np.zeros(module.bias.shape), dtype=dtype))
        for b in self.transformer.h:
            for layer in (b.attn.c_proj, b.mlp.c_proj):
                layer.weight.copy_(Tensor(ct.generator().normal(0.0, 0.02 / math.sqrt(2 * config.n_layer),
                                                                 layer.weight.shape), dtype=dtype))
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, idx, targets=None):
        B, T = np.shape(idx)
        assert T <= self.config.block_size, f"{T} positions, more than block_size {self.config.block_size}"
        x = self.transformer.wte(idx) + self.transformer.wpe(np.arange(T))
        for b in self.transformer.h:
            x = b(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits, None
        log_p = logits.reshape(B * T, -1).log_softmax(-1)
        picked = Tensor(np.eye(self.config.vocab_size)[np.asarray(targets).reshape(-1)], dtype=logits.dtype)
        return logits, -(log_p * picked).sum() * (1.0 / (B * T))


# ---- 9. AdamW ------------------------------------------------------------------------------------------------

def groups(mistake=None):
    def param_groups(model, weight_decay):
        params = model.parameters()
        if mistake == "decay on the norms":                # every vector but the biases decays
            return [{"params": [p for n, p in model.named_parameters() if not n.endswith("bias")],
                     "weight_decay": weight_decay},
                    {"params": [p for n, p in model.named_parameters() if n.endswith("bias")], "weight_decay": 0.0}]
        if mistake == "decay everything":
            return [{"params": params, "weight_decay": weight_decay}]
        return answer_optim.param_groups(model, weight_decay)
    return param_groups


def adamw(mistake=None):
    class AdamW(answer_optim.AdamW):
        def step(self):
            b1, b2 = self.betas
            shared = getattr(self, "shared", 0) + 1
            self.shared = shared
            for i, p, group in self._numbered():
                if p.grad is None:
                    continue
                if i not in self.state:
                    self.state[i] = {"step": 0, "m": np.zeros(p.shape), "v": np.zeros(p.shape)}
                s = self.state[i]
                s["step"] += 1
                t = shared if mistake == "one step count" else s["step"]
                lr = self.param_groups[0]["lr"] if mistake == "first group's lr" else group["lr"]
                g = p.grad.numpy()
                value = p.numpy()
                if mistake == "coupled":
                    g = g + group["weight_decay"] * value
                elif mistake != "decay after":
                    value = value * (1 - lr * group["weight_decay"])
                new, s["m"], s["v"] = self.adam_step(value, g, s["m"], s["v"], t, lr, b1, b2, self.eps)
                if mistake == "decay after":
                    new = new * (1 - lr * group["weight_decay"])
                p.copy_(Tensor(new, dtype=p.dtype))

        def state_dict(self):
            if mistake == "forgets the moments":          # a resume then starts them from zero
                return {"state": {i: {"step": s["step"]} for i, s in self.state.items()}, "param_groups": []}
            return super().state_dict()

        def load_state_dict(self, state):
            if mistake == "forgets the moments":
                self.state = {i: {"step": s["step"], "m": 0.0, "v": 0.0} for i, s in state["state"].items()}
                return
            super().load_state_dict(state)
    return AdamW


@pytest.mark.parametrize("groups_mistake, adamw_mistake, match", [
    ("decay on the norms", None, "a layer norm's vector, is in a group that decays"),
    ("decay everything", None, "is in a group that decays"),
    (None, "coupled", "parameters after step"),
    (None, "decay after", "parameters after step"),
    (None, "first group's lr", "parameters after step"),
    (None, "one step count", "parameters after step"),
    (None, "forgets the moments", "load_state_dict"),
])
def test_adamw_mistakes(groups_mistake, adamw_mistake, match):
    expect_failure(check.adamw, groups(groups_mistake), adamw(adamw_mistake), match=match)


def test_adamw_must_run_the_adam_step_it_is_given():
    class OwnMoments(answer_optim.AdamW):
        def __init__(self, *args, adam_step, **kwargs):
            super().__init__(*args, adam_step=answer_optim.adam_step, **kwargs)
    expect_failure(check.adamw, answer_optim.param_groups, OwnMoments, match="did not run the adam_step")


class AdamWByKeys:
    """Correct, written otherwise: the state keyed by (group, index) and saved as lists; the decay on the
    library's ops."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, adam_step):
        params = list(params)
        groups_ = params if isinstance(params[0], dict) else [{"params": params}]
        self.param_groups = []
        for g in groups_:
            group = dict(g)
            group.setdefault("lr", lr)
            group.setdefault("weight_decay", weight_decay)
            self.param_groups.append(group)
        self.b1, self.b2, self.eps, self.step_fn = betas[0], betas[1], eps, adam_step
        self.moments = {}

    def zero_grad(self, set_to_none=True):
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    def step(self):
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                t, m, v = self.moments.get((gi, pi), (0, 0.0, 0.0))
                with no_grad():
                    shrunk = (p * (1.0 - group["lr"] * group["weight_decay"])).numpy()
                new, m, v = self.step_fn(shrunk, p.grad.numpy(), m, v, t + 1, group["lr"], self.b1, self.b2, self.eps)
                self.moments[(gi, pi)] = (t + 1, m, v)
                p.copy_(Tensor(new, dtype=p.dtype))

    def state_dict(self):
        return {"moments": [[key, t, np.copy(m), np.copy(v)] for key, (t, m, v) in self.moments.items()],
                "lrs": [g["lr"] for g in self.param_groups]}

    def load_state_dict(self, state):
        self.moments = {tuple(key): (t, m, v) for key, t, m, v in state["moments"]}
        for g, lr in zip(self.param_groups, state["lrs"]):
            g["lr"] = lr


def groups_by_shape(model, weight_decay):
    """Correct, written otherwise: the groups the other way round, by the length of each shape."""
    decay, keep = [], []
    for _, p in model.named_parameters():
        (decay if len(p.shape) > 1 else keep).append(p)
    return [{"params": keep, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]


# ---- 10. the schedule -----------------------------------------------------------------------------------------

def lr_at(mistake=None):
    def schedule(it, cfg):
        if it < cfg.warmup_iters:
            return cfg.lr * (it if mistake == "off by one" else it + 1) / cfg.warmup_iters
        if it >= cfg.lr_decay_iters:
            return 0.0 if mistake == "to zero" else cfg.min_lr
        start = 0 if mistake == "from step 0" else cfg.warmup_iters
        progress = (it - start) / (cfg.lr_decay_iters - start)
        floor = 0.0 if mistake == "to zero" else cfg.min_lr
        return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - floor)
    return schedule


@pytest.mark.parametrize("mistake, match", [
    ("off by one", "one step late"),
    ("to zero", "ends at 0"),
    ("from step 0", "since step 0"),
])
def test_lr_schedule_mistakes(mistake, match):
    expect_failure(check.lr_schedule, lr_at(mistake), match=match)


def lr_by_phases(it, cfg):
    """Correct, written otherwise: one expression per phase, chosen by min and max."""
    warm = cfg.lr * min(it + 1, cfg.warmup_iters) / cfg.warmup_iters
    progress = min(max(it - cfg.warmup_iters, 0) / (cfg.lr_decay_iters - cfg.warmup_iters), 1.0)
    cosine = cfg.min_lr + (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress)) / 2
    return warm if it < cfg.warmup_iters else cosine


# ---- 11. clipping -------------------------------------------------------------------------------------------

def clip(mistake=None):
    def clip_grad_norm(params, max_norm):
        grads = [p.grad for p in params if p.grad is not None]
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
        for p in params:
            if p.grad is None:
                continue
            if mistake == "per tensor":
                own = math.sqrt(float((p.grad * p.grad).sum()))
                p.grad = p.grad * min(1.0, max_norm / (own + 1e-6))
            elif mistake == "always" or norm > max_norm:
                p.grad = p.grad * (max_norm / (norm + (0.0 if mistake == "no 1e-6" else 1e-6)))
        if mistake == "norm after":
            return math.sqrt(sum(float((p.grad * p.grad).sum()) for p in params if p.grad is not None))
        return norm
    return clip_grad_norm


@pytest.mark.parametrize("mistake, match", [
    ("per tensor", "clipped by its own norm"),
    ("always", "scaled up"),
    ("no 1e-6", "after clipping"),
    ("norm after", "norm returned"),
])
def test_clip_mistakes(mistake, match):
    expect_failure(check.clip_grad_norm, clip(mistake), match=match)


def clip_in_numpy(params, max_norm):
    """Correct, written otherwise: the norm of one concatenated numpy vector; scaled in place."""
    with_grad = [p for p in params if p.grad is not None]
    flat = np.concatenate([p.grad.numpy().reshape(-1) for p in with_grad])
    norm = float(np.linalg.norm(flat))
    coef = min(max_norm / (norm + 1e-6), 1.0)
    for p in with_grad:
        p.grad.mul_(coef)
    return norm


# ---- 12. checkpoints ------------------------------------------------------------------------------------------

def checkpoint(mistake=None):
    def save(path, it, model, optimizer, batches):
        state = {"iter": it + (1 if mistake == "off by one" else 0), "model": model.state_dict()}
        if mistake != "no optimizer":
            state["optimizer"] = optimizer.state_dict()
        if mistake != "no draws":
            state["rng"] = batches.rng.bit_generator.state
        with open(path, "wb") as f:
            pickle.dump(state, f)

    def load(path, model, optimizer, batches):
        with open(path, "rb") as f:
            state = pickle.load(f)
        model.load_state_dict(state["model"])
        if "optimizer" in state:
            optimizer.load_state_dict(state["optimizer"])
        if "rng" in state:
            batches.rng.bit_generator.state = state["rng"]
        return state["iter"]
    return save, load


@pytest.mark.parametrize("mistake, match", [
    ("no optimizer", "optimizer's state is not the one saved"),
    ("no draws", "generator is not where it stood"),
    ("off by one", "load_checkpoint returned"),
])
def test_checkpoint_mistakes(mistake, match):
    expect_failure(check.checkpoint, *checkpoint(mistake), match=match)


def save_whole(path, it, model, optimizer, batches):
    """Correct, written otherwise: one tuple, the Generator itself pickled."""
    with open(path, "wb") as f:
        pickle.dump((it, model.state_dict(), optimizer.state_dict(), batches.rng), f)


def load_whole(path, model, optimizer, batches):
    with open(path, "rb") as f:
        it, weights, state, batches.rng = pickle.load(f)
    model.load_state_dict(weights)
    optimizer.load_state_dict(state)
    return it


# ---- 13. the loop ----------------------------------------------------------------------------------------

def train_loop(mistake=None):
    def train(model, optimizer, batches, cfg, lib, checkpoint=None, save_every=0, resume=False):
        history = {k: [] for k in ("iter", "lr", "loss", "eval_iter", "train_loss", "val_loss")}

        def evaluate(it):
            means = answer_train.evaluate(model, batches, cfg.eval_iters, lib)
            history["eval_iter"].append(it)
            history["train_loss"].append(means["train"])
            history["val_loss"].append(means["val"])

        start = answer_train.load_checkpoint(checkpoint, model, optimizer, batches) if resume and \
            mistake != "resume ignored" else 0
        for it in range(start, cfg.max_iters):
            if mistake != "evaluates after" and cfg.eval_interval and it % cfg.eval_interval == 0:
                evaluate(it)
            lr = answer_optim.lr_at(it + 1 if mistake == "rate one step ahead" else it, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, y = batches.get("train")
            history["iter"].append(it)
            history["lr"].append(lr)
            history["loss"].append(float(train_step(model, optimizer, x, y, cfg.grad_clip, lib)))
            if mistake == "evaluates after" and cfg.eval_interval and it % cfg.eval_interval == 0:
                evaluate(it)
            if checkpoint and save_every and (it + 1) % save_every == 0 and mistake != "saves after the evaluation":
                answer_train.save_checkpoint(checkpoint, it + 1, model, optimizer, batches)
        evaluate(cfg.max_iters)
        if mistake == "saves after the evaluation" and checkpoint and save_every and cfg.max_iters % save_every == 0:
            answer_train.save_checkpoint(checkpoint, cfg.max_iters, model, optimizer, batches)
        return history
    return train


@pytest.mark.parametrize("mistake, match", [
    ("rate one step ahead", "schedule's value at step it + 1"),
    ("evaluates after", "history"),
    ("resume ignored", "goes on from step"),
    ("saves after the evaluation", "bit for bit"),
])
def test_train_mistakes(mistake, match):
    expect_failure(check.train, train_loop(mistake), match=match)


def train_with_chapter_04s_evaluation(model, optimizer, batches, cfg, lib, checkpoint=None, save_every=0,
                                      resume=False):
    """Correct, written otherwise: chapter 04's estimate_loss, a while loop, and a checkpoint taken at the top
    of the next step (and at the end, before the last evaluation)."""
    from course_lib.gpt import trainer

    history = {"iter": [], "lr": [], "loss": [], "eval_iter": [], "train_loss": [], "val_loss": []}

    def note(it):
        means = trainer.estimate_loss(model, batches.get, cfg.eval_iters, lib)
        history["eval_iter"].append(it)
        history["train_loss"].append(means["train"])
        history["val_loss"].append(means["val"])

    it = answer_train.load_checkpoint(checkpoint, model, optimizer, batches) if resume else 0
    first = it
    while it < cfg.max_iters:
        if checkpoint and save_every and it > first and it % save_every == 0:
            answer_train.save_checkpoint(checkpoint, it, model, optimizer, batches)
        if cfg.eval_interval and it % cfg.eval_interval == 0:
            note(it)
        rate = answer_optim.lr_at(it, cfg)
        for group in optimizer.param_groups:
            group["lr"] = rate
        history["loss"].append(float(train_step(model, optimizer, *batches.get("train"), cfg.grad_clip, lib)))
        history["iter"].append(it)
        history["lr"].append(rate)
        it += 1
    if checkpoint and save_every and it > first and it % save_every == 0:
        answer_train.save_checkpoint(checkpoint, it, model, optimizer, batches)
    note(cfg.max_iters)
    return history


# ---- 14. sampling ---------------------------------------------------------------------------------------

def sampler(mistake=None):
    def generate(model, idx, max_new_tokens, temperature, top_k, draw):
        if mistake != "training mode":
            model.eval()
        idx = np.asarray(idx)
        for _ in range(max_new_tokens):
            context = idx if mistake == "no crop" else idx[:, -model.config.block_size:]
            if mistake == "records a graph":
                logits, _ = model(context)
            else:
                with no_grad():
                    logits, _ = model(context)
            last = logits.numpy()[:, -1, :]
            last = last * temperature if mistake == "temperature multiplies" else last / temperature
            if top_k is not None and top_k < last.shape[-1]:
                kth = np.sort(last, axis=-1)[:, -(top_k + 1 if mistake == "one too many" else top_k), None]
                last = np.where(last < kth, -np.inf, last)
            probs = np.exp(last - last.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            idx = np.concatenate([idx, np.asarray(draw(probs)).reshape(-1, 1)], axis=1)
        return idx
    return generate


@pytest.mark.parametrize("mistake, match", [
    ("no crop", "block_size"),
    ("records a graph", "recorded a graph"),
    ("training mode", "training mode"),
    ("temperature multiplies", "probabilities handed to draw"),
    ("one too many", "probabilities handed to draw"),
])
def test_generate_mistakes(mistake, match):
    expect_failure(check.generate, sampler(mistake), match=match)


def generate_with_partition(model, idx, max_new_tokens, temperature, top_k, draw):
    """Correct, written otherwise: the library's softmax on a Tensor, top-k by np.partition, the model switched
    to eval mode through train(False)."""
    model.train(False)
    out = np.array(idx)
    for _ in range(max_new_tokens):
        with no_grad():
            logits = model(out[:, max(0, out.shape[1] - model.config.block_size):])[0]
        scaled = logits.numpy()[:, -1] / temperature
        if top_k:
            floor = np.partition(scaled, -min(top_k, scaled.shape[-1]), axis=-1)[:, -min(top_k, scaled.shape[-1])]
            scaled = np.where(scaled >= floor[:, None], scaled, -np.inf)
        probs = Tensor(scaled, dtype=np.float64).softmax(-1).numpy()
        out = np.hstack([out, np.asarray(draw(probs), dtype=np.int64)[:, None]])
    return out


# ---- every check: the course's answer and a different correct answer pass; the untouched stub fails -----------

ANSWERS = {
    "softmax_function": [(answers.Softmax,), (SoftmaxFromLogSumExp,)],
    "gelu_function": [(answers.GELU,), (GELUSigmoid,)],
    "layer_norm_function": [(answers.LayerNorm,), (LayerNormFromMoments,)],
    "embedding_function": [(answers.Embedding,), (EmbeddingByCounts,)],
    "masked_fill_function": [(answers.MaskedFill,), (MaskedFillKept,)],
    "attention_function": [(answers.CausalAttention,), (FlashStyleAttention,)],
    "block": [(answer_model.Block,), (block(),)],
    "gpt": [(answer_model.GPT,), (GPTTiedAfter,)],
    "adamw": [(answer_optim.param_groups, answer_optim.AdamW), (groups_by_shape, AdamWByKeys)],
    "lr_schedule": [(answer_optim.lr_at,), (lr_by_phases,)],
    "clip_grad_norm": [(answer_optim.clip_grad_norm,), (clip_in_numpy,)],
    "checkpoint": [(answer_train.save_checkpoint, answer_train.load_checkpoint), (save_whole, load_whole)],
    "train": [(answer_train.train,), (train_with_chapter_04s_evaluation,)],
    "generate": [(answer_sample.generate,), (generate_with_partition,)],
}
STUBS = {"block": (StubModule,), "gpt": (StubModule,), "adamw": (_stub, _stub), "checkpoint": (_stub, _stub)}
FUNCTIONS = {"softmax_function", "gelu_function", "layer_norm_function", "embedding_function", "masked_fill_function",
             "attention_function"}


def test_every_check_of_the_chapter_is_tested():
    from course_lib.checks import REGISTRY
    assert set(ANSWERS) == set(REGISTRY["12"])


@pytest.mark.parametrize("name, which", [(n, k) for n in ANSWERS for k in (0, 1)])
def test_checks_pass_on_the_courses_answers_and_on_correct_answers_written_otherwise(name, which):
    expect_pass(getattr(check, name), *ANSWERS[name][which])


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_stubs_fail(name):
    stub = STUBS.get(name, (Stub,) if name in FUNCTIONS else (_stub,))
    expect_failure(getattr(check, name), *stub, match="not implemented yet")


def test_a_function_must_be_a_function_class():
    expect_failure(check.softmax_function, lambda a, dim: a.softmax(dim), match="derived from the library's Function")


# ---- the chapter's exercises, as a whole -------------------------------------------------------------------

def test_the_learner_writes_at_least_150_lines_none_of_them_an_earlier_chapters_exercise():
    """Chapter 12's answers (the significant lines of its solution regions) are at least 150 lines, and none
    repeats a line of an earlier chapter's answer, nor three of its lines with other names."""
    from test_teaching import EXERCISES, shapes

    ours = [ex for ex in EXERCISES if ex.notebook.startswith("12_")]
    earlier = [ex for ex in EXERCISES if ex.notebook[:2] < "12"]
    assert sum(len(ex.answer) for ex in ours) >= 150, [len(ex.answer) for ex in ours]
    their_lines = {line for ex in earlier for line in ex.answer if len(line) > 20}
    assert not [line for ex in ours for line in ex.answer if line in their_lines]
    their_shapes = {shape for ex in earlier for shape in shapes(ex.answer)}
    repeated = [ex.cell for ex in ours if set(shapes(ex.answer)) & their_shapes]
    assert not repeated, f"solutions/12 cells {repeated} repeat three lines of an earlier chapter's answer"
