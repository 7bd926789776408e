"""Checks for chapter 12, the capstone: layer norm's backward, the embedding's backward (a scatter-add)
and the causal self-attention of your GPT, written on course_lib.tensor. Each is compared in float64 with
PyTorch's autograd on random shapes."""

import math

import numpy as np
import torch
import torch.nn.functional as F

import course_lib.tensor as ct
from course_lib.checks import CheckFailed, assert_close, exercise, fmt, require, rng
from course_lib.gpt.model import CausalSelfAttention as TorchAttention
from course_lib.gpt.model import GPTConfig
from course_lib.tensor import nn


def _array(x, what):
    """Your result as a float64 numpy array: a course Tensor, a numpy array or a torch tensor."""
    if x is None:
        raise CheckFailed(f"{what}: your code returned None. Did you forget a `return`?")
    if isinstance(x, ct.Tensor):
        return x.numpy().astype(np.float64)
    if isinstance(x, torch.Tensor):
        return x.detach().numpy().astype(np.float64)
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise CheckFailed(f"{what}: expected a Tensor or an array, got {type(x).__name__}: {fmt(x)}") from None


def _t(a):
    return torch.tensor(a, dtype=torch.float64, requires_grad=True)


# ---- 1. layer norm's backward ------------------------------------------------------------------------

def _layer_norm_case(shape, eps=1e-5):
    a = rng().normal(size=shape) * rng().uniform(0.5, 3.0) + rng().uniform(-2.0, 2.0)
    weight, bias = rng().uniform(0.5, 2.0, shape[-1:]) * rng().choice([-1, 1], shape[-1:]), rng().normal(size=shape[-1:])
    grad = rng().normal(size=shape)
    centered = a - a.mean(-1, keepdims=True)
    r = 1.0 / np.sqrt((centered ** 2).mean(-1, keepdims=True) + eps)
    return a, weight, bias, grad, centered * r, r


def _layer_norm_mistakes(grad, xhat, r, weight):
    g = grad * weight
    mean_g, mean_gx = g.mean(-1, keepdims=True), (g * xhat).mean(-1, keepdims=True)
    return {
        "that is r * (g - mean(g)): the variance depends on the input too; the term with xhat * mean(g * xhat) "
        "is its share of the gradient": r * (g - mean_g),
        "the mean of g is missing: the mean that is subtracted depends on every input of the row": r * (g - mean_gx * xhat),
        "the gain is missing: the gradient reaching xhat is grad * weight, since out = xhat * weight + bias": (
            r * (grad - grad.mean(-1, keepdims=True) - xhat * (grad * xhat).mean(-1, keepdims=True))),
        "the factor r = 1/sqrt(var + eps) is missing: xhat is (a - mean) * r, so every path into a is scaled by r": (
            g - mean_g - xhat * mean_gx),
        "sums instead of means: each row's mean and variance divide by n, so do their gradients": (
            r * (g - g.sum(-1, keepdims=True) - xhat * (g * xhat).sum(-1, keepdims=True))),
    }


@exercise
def layer_norm_backward(your_layer_norm_backward):
    """layer_norm_backward(grad, xhat, r, weight) -> (d_a, d_weight, d_bias), all course Tensors in float64."""
    shapes = [(int(rng().integers(2, 7)), int(rng().integers(3, 12))),
              (int(rng().integers(1, 4)), int(rng().integers(2, 6)), int(rng().integers(3, 12)))]
    for shape in shapes:
        a, weight, bias, grad, xhat, r = _layer_norm_case(shape)
        ta, tw, tb = _t(a), _t(weight), _t(bias)
        F.layer_norm(ta, shape[-1:], tw, tb, eps=1e-5).backward(torch.from_numpy(grad))
        inputs = {"grad": grad, "xhat": xhat, "r": r, "weight": weight}
        out = your_layer_norm_backward(*(ct.Tensor(v, dtype=np.float64) for v in (grad, xhat, r, weight)))
        require(isinstance(out, (tuple, list)) and len(out) == 3,
                f"return three gradients (d_a, d_weight, d_bias); got {type(out).__name__}"
                + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""))
        d_a, d_w, d_b = (_array(x, name) for x, name in zip(out, ("d_a", "d_weight", "d_bias")))
        assert_close(d_a, ta.grad.numpy(), what=f"d_a for an input of shape {shape}", rtol=1e-7, atol=1e-9,
                     inputs=inputs, mistakes=_layer_norm_mistakes(grad, xhat, r, weight))
        rows, x_rows = grad.reshape(-1, shape[-1]), xhat.reshape(-1, shape[-1])
        assert_close(d_w, tw.grad.numpy(), what=f"d_weight for an input of shape {shape}", rtol=1e-7, atol=1e-9,
                     inputs=inputs,
                     hint="the gain multiplies xhat, so its gradient adds up grad * xhat over every row "
                          "(every dim but the last)",
                     mistakes={"that is the sum of grad alone; the gain's gradient is the sum of grad * xhat":
                               rows.sum(0)})
        assert_close(d_b, tb.grad.numpy(), what=f"d_bias for an input of shape {shape}", rtol=1e-7, atol=1e-9,
                     inputs=inputs, hint="the bias is added to every row, so its gradient adds up grad over every row",
                     mistakes={"that is the sum of grad * xhat, the gain's gradient; the bias gets the sum of grad":
                               (rows * x_rows).sum(0)})
    return "a 2-D and a 3-D input, against PyTorch's layer_norm"


# ---- 2. the embedding's backward -------------------------------------------------------------------

@exercise
def embedding_backward(your_embedding_backward):
    """embedding_backward(grad, idx, num_embeddings) -> d_weight (num_embeddings, D): a scatter-add."""
    cases = [(int(rng().integers(7, 15)),), (int(rng().integers(2, 4)), int(rng().integers(4, 9)))]
    for idx_shape in cases:
        V, D = int(rng().integers(4, 7)), int(rng().integers(2, 6))
        n = int(np.prod(idx_shape))
        idx = rng().integers(0, V - 1, size=idx_shape)          # row V-1 is never looked up
        flat = idx.reshape(-1)
        flat[rng().permutation(n)[:2]] = flat[0]                # and one row is looked up several times
        grad = rng().normal(size=idx_shape + (D,))
        weight = _t(rng().normal(size=(V, D)))
        F.embedding(torch.from_numpy(idx), weight).backward(torch.from_numpy(grad))
        inputs = {"idx": idx, "num_embeddings": V, "grad": grad}
        rows = grad.reshape(-1, D)
        last_wins = np.zeros((V, D))
        last_wins[flat] = rows
        counts = np.maximum(np.bincount(flat, minlength=V), 1)[:, None]
        mistakes = {
            "rows looked up more than once kept one gradient, not their sum: with repeated indices, "
            "`out[idx] += g` and `out[idx] = g` write each row once (numpy does not add up the repeats)": last_wins,
            "that is the mean over the positions of each row; the gradient is their sum": weight.grad.numpy() / counts,
        }
        yours = your_embedding_backward(grad.copy(), idx.copy(), V)
        assert_close(_array(yours, "d_weight"), weight.grad.numpy(), what=f"d_weight for idx of shape {idx_shape}",
                     rtol=1e-9, atol=1e-12, inputs=inputs, mistakes=mistakes,
                     hint="row i of the gradient is the sum of the grad rows of every position whose index is i")
    return "1-D and 2-D indices with repeats and an unused row, against PyTorch's embedding"


# ---- 3. causal self-attention --------------------------------------------------------------------

def _linear(n_in, n_out, W, b):
    layer = nn.Linear(n_in, n_out, dtype=np.float64)
    layer.load_state_dict({"weight": W, "bias": b})
    return layer


def _attention_variants(x, Wa, ba, Wp, bp, H):
    """Common mistakes, in torch: {hint: output}."""
    B, T, C = x.shape
    d = C // H
    q, k, v = (x @ Wa.T + ba).split(C, dim=2)
    heads = lambda t: t.view(B, T, H, d).transpose(1, 2)            # noqa: E731
    no_transpose = lambda t: t.reshape(B, H, T, d)                   # noqa: E731
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)

    def attend(q, k, v, mask=future, scale=1 / math.sqrt(d), dim=-1, back=lambda y: y.transpose(1, 2)):
        att = (q @ k.transpose(-2, -1)) * scale
        if mask is not None:
            att = att.masked_fill(mask, float("-inf"))
        return back(att.softmax(dim) @ v).reshape(B, T, C)

    proj = lambda y: y @ Wp.T + bp                                   # noqa: E731
    out = {
        "no causal mask: position i must not see the positions after it (fill them with -inf before the softmax)":
            proj(attend(heads(q), heads(k), heads(v), mask=None)),
        "the mask hides the diagonal too: position i may see itself (triu with k=1 hides only j > i)":
            proj(attend(heads(q), heads(k), heads(v), mask=torch.triu(torch.ones(T, T, dtype=torch.bool), 0))),
        "the scores are scaled by 1/d, not 1/sqrt(d) (d = C / n_head, one head's width)":
            proj(attend(heads(q), heads(k), heads(v), scale=1 / d)),
        "the scores are not scaled: divide q k^T by sqrt(d), d = C / n_head":
            proj(attend(heads(q), heads(k), heads(v), scale=1.0)),
        "the softmax runs over the wrong dim: each query's row of scores (the last dim) must sum to 1":
            proj(attend(heads(q), heads(k), heads(v), dim=-2)),
        "the heads were cut by a reshape alone: (B, T, C) -> (B, T, H, d) first, then swap T and H":
            proj(attend(no_transpose(q), no_transpose(k), no_transpose(v), back=lambda y: y)),
        "q and k are swapped: scores[i, j] is query i against key j, q @ k^T":
            proj(attend(heads(k), heads(q), heads(v))),
        "the output projection c_proj is missing":
            attend(heads(q), heads(k), heads(v)),
    }
    return {hint: y.detach().numpy() for hint, y in out.items()}


@exercise
def causal_self_attention(your_causal_self_attention):
    """causal_self_attention(x, c_attn, c_proj, n_head) -> (B, T, C) course Tensor, with gradients."""
    for H, d in ((int(rng().integers(1, 3)), int(rng().integers(2, 5))), (int(rng().integers(3, 5)), int(rng().integers(1, 4)))):
        B, T, C = int(rng().integers(1, 4)), int(rng().integers(3, 10)), H * d
        torch.manual_seed(int(rng().integers(2**31)))
        ref = TorchAttention(GPTConfig(n_embd=C, n_head=H, block_size=T, dropout=0.0)).double().eval()
        with torch.no_grad():
            for p in ref.parameters():
                p.normal_(0.0, 0.5)
        x = rng().normal(size=(B, T, C))
        w_out = rng().normal(size=(B, T, C))
        tx = _t(x)
        expected = ref(tx)
        (expected * torch.from_numpy(w_out)).sum().backward()
        sd = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
        c_attn = _linear(C, 3 * C, sd["c_attn.weight"], sd["c_attn.bias"])
        c_proj = _linear(C, C, sd["c_proj.weight"], sd["c_proj.bias"])
        x_ours = ct.Tensor(x, requires_grad=True, dtype=np.float64)
        inputs = {"x.shape": (B, T, C), "n_head": H}
        y = your_causal_self_attention(x_ours, c_attn, c_proj, H)
        require(isinstance(y, ct.Tensor),
                f"return a course Tensor (course_lib.tensor), got {type(y).__name__}: the gradients flow through "
                "the library's ops, so compute with Tensors, not with numpy arrays")
        variants = _attention_variants(tx.detach(), *(torch.from_numpy(sd[k]) for k in
                                       ("c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias")), H)
        assert_close(y.numpy(), expected.detach().numpy(), what=f"the output for x of shape {(B, T, C)}, {H} heads",
                     rtol=1e-7, atol=1e-9, inputs=inputs, mistakes=variants)
        require(y.requires_grad,
                "your output carries no gradient: it must be computed from x and the layers with the library's "
                "ops (a .numpy() on the way cuts the graph)")
        (y * ct.Tensor(w_out, dtype=np.float64)).sum().backward()
        pairs = [("x", x_ours, tx), ("c_attn.weight", c_attn.weight, ref.c_attn.weight),
                 ("c_attn.bias", c_attn.bias, ref.c_attn.bias), ("c_proj.weight", c_proj.weight, ref.c_proj.weight),
                 ("c_proj.bias", c_proj.bias, ref.c_proj.bias)]
        for name, ours, theirs in pairs:
            require(ours.grad is not None, f"no gradient reached {name}: is it used through the library's ops?")
            assert_close(ours.grad.numpy(), theirs.grad.numpy(), what=f"the gradient of {name}", rtol=1e-7,
                         atol=1e-9, inputs=inputs)
    return "2 random shapes with 1 to 4 heads: output and gradients against chapter 04's PyTorch attention"
