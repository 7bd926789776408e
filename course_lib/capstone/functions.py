"""The course's answers to chapter 12's six fused Functions: read each one once your check passes.

Each is one node of the graph: its forward computes under `no_grad()` (nothing inside is recorded) and
keeps on `ctx` only what its backward multiplies by; its backward is worked out by hand, written with the
library's ops. The library's own versions of the first five (tensor/functions.py) are chains of recorded
ops; `fused_ops()` below puts these in their place, through the op registry (`use_ops`).
"""

import contextlib
import math

import numpy as np

from course_lib.tensor import OPS, Function, Tensor, no_grad, use_ops, where
from course_lib.tensor import functions as library_functions
from course_lib.tensor.tensor_data import TensorData

C, K = math.sqrt(2.0 / math.pi), 0.044715   # GPT-2's GELU: 0.5 a (1 + tanh(C (a + K a^3)))


class Softmax(Function):
    """The course's answer to exercise 12.1 (`softmax_function`): read it once your check passes.

    s = exp(a - max) / sum(exp(a - max)) over `dim`. The backward needs s alone: the sum over the row
    comes back as sum(grad * s), broadcast along the row."""

    @staticmethod
    def forward(ctx, a, dim):
        with no_grad():
            e = (a - a.max(dim, keepdim=True)).exp()
            ctx.s, ctx.dim = e / e.sum(dim, keepdim=True), dim
        return ctx.s.data

    @staticmethod
    def backward(ctx, grad):
        s = ctx.s
        return s * (grad - (grad * s).sum(ctx.dim, keepdim=True))


class GELU(Function):
    """The course's answer to exercise 12.2 (`gelu_function`): read it once your check passes.

    GPT-2's GELU, 0.5 a (1 + tanh u) with u = C (a + K a^3), written as a * s with s = sigmoid(2u): the
    same numbers, since 0.5 (1 + tanh u) = sigmoid(2u), with an exp where the tanh form takes a tanh (a
    kernel computes it several times faster), and no cancellation in 1 + tanh u for very negative a. It
    keeps a^2 and s besides the input: the product rule gives s + a s (1 - s) d(2u)/da, and d(2u)/da is
    written with a^2."""

    @staticmethod
    def forward(ctx, a):
        with no_grad():
            a = a.detach()
            a2 = a * a
            s = (a * (2 * C + (2 * C * K) * a2)).sigmoid()
            ctx.a, ctx.a2, ctx.s = a, a2, s
            return (a * s).data

    @staticmethod
    def backward(ctx, grad):
        a, a2, s = ctx.a, ctx.a2, ctx.s
        du2 = 2 * C + (6 * C * K) * a2
        return grad * (s + a * s * (1.0 - s) * du2)


class LayerNorm(Function):
    """The course's answer to exercise 12.3 (`layer_norm_function`): read it once your check passes.

    Over the last dim: xhat = (a - mean) r with r = 1 / sqrt(var + eps), out = xhat * weight + bias. It
    keeps xhat, r (one number per row) and the gain. With g = grad * weight, the input's gradient is
    r (g - mean(g) - xhat mean(g xhat)): one term per path from a to xhat (direct, through the mean, through
    the variance). The gain's and the bias's gradients add up over every row."""

    @staticmethod
    def forward(ctx, a, weight, bias, eps):
        with no_grad():
            centered = a - a.mean(-1, keepdim=True)
            r = 1.0 / ((centered * centered).mean(-1, keepdim=True) + eps).sqrt()
            ctx.xhat, ctx.r, ctx.weight = centered * r, r, weight.detach()
            return (ctx.xhat * ctx.weight + bias).data

    @staticmethod
    def backward(ctx, grad):
        xhat, r, n = ctx.xhat, ctx.r, ctx.xhat.shape[-1]
        g = grad * ctx.weight
        d_a = r * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
        rows = grad.reshape(-1, n)
        return d_a, (rows * xhat.reshape(-1, n)).sum(0), rows.sum(0)


class Embedding(Function):
    """The course's answer to exercise 12.4 (`embedding_function`): read it once your check passes.

    A gather forward, weight[idx], and a scatter-add backward that keeps only the indices: np.add.at adds
    every occurrence of a repeated index (a fancy `+=` would add one)."""

    @staticmethod
    def forward(ctx, weight, idx):
        ctx.idx, ctx.rows = idx, weight.shape[0]
        return TensorData.from_numpy(weight.data.to_numpy()[idx], weight.dtype)

    @staticmethod
    def backward(ctx, grad):
        D = grad.shape[-1]
        d_weight = np.zeros((ctx.rows, D), dtype=grad.dtype)
        np.add.at(d_weight, ctx.idx.reshape(-1), grad.data.to_numpy().reshape(-1, D))
        return Tensor(d_weight, dtype=grad.dtype)


class MaskedFill(Function):
    """The course's answer to exercise 12.5 (`masked_fill_function`): read it once your check passes.

    Picks with `where`, never with arithmetic (-inf * 0 is nan); the filled places get no gradient."""

    @staticmethod
    def forward(ctx, a, mask, value):
        ctx.mask = mask.detach()
        with no_grad():
            return where(mask, value, a).data

    @staticmethod
    def backward(ctx, grad):
        return where(ctx.mask, 0.0, grad), None


class CausalAttention(Function):
    """The course's answer to exercise 12.6 (`attention_function`): read it once your check passes.

    softmax(q k^T / sqrt(d), causal) v for q, k, v (B, H, T, d), as one node. It keeps q, k, v and the
    weights p. Backward, step by step from the output: y = p v gives dp = grad v^T and dv = p^T grad; the
    softmax gives ds = p (dp - rowsum(dp p)) (the masked entries, p = 0, get none); the scaled product
    gives dq = ds k / sqrt(d) and dk = ds^T q / sqrt(d). (q, k, v and grad arrive as views of transposed
    heads: every elementwise step here works on the contiguous results of products instead.)"""

    @staticmethod
    def forward(ctx, q, k, v):
        T, d = q.shape[-2], q.shape[-1]
        with no_grad():
            q, k, v = q.detach(), k.detach(), v.detach()
            future = Tensor(np.triu(np.ones((T, T)), k=1), dtype=q.dtype)
            p = ((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))).masked_fill(future, float("-inf")).softmax(-1)
            ctx.q, ctx.k, ctx.v, ctx.p = q, k, v, p
            return (p @ v).data

    @staticmethod
    def backward(ctx, grad):
        q, k, v, p = ctx.q, ctx.k, ctx.v, ctx.p
        dp = grad @ v.transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True)) * (1.0 / math.sqrt(q.shape[-1]))
        return ds @ k, ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ grad


# ---- the op registry's names of these Functions -------------------------------------------------------

FUSED = {"Softmax": Softmax, "GELUTanh": GELU, "LayerNorm": LayerNorm, "Embedding": Embedding,
         "MaskedFill": MaskedFill}


@contextlib.contextmanager
def fused_ops():
    """Inside the block, the library's composed softmax, GELU, layer norm, embedding and masked fill are the
    Functions above, except those an outer `use_ops` block has already replaced (a learner's, say)."""
    free = {name: f for name, f in FUSED.items() if getattr(OPS, name) is getattr(library_functions, name)}
    with use_ops(**free):
        yield
