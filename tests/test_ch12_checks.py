"""Chapter 12's checks pass on the reference and reject the usual mistakes."""

import math

import numpy as np
import pytest
from checking import expect_failure, expect_pass

from course_lib.checks import ch12 as check
from course_lib.tensor import Tensor

# ---- references, written as a learner would, with switches for the mistakes ------------------------


def layer_norm_backward(grad, xhat, r, weight, mistake=None):
    n = xhat.shape[-1]
    g = grad if mistake == "no weight" else grad * weight
    mean_g = g.mean(-1, keepdim=True)
    mean_gx = (g * xhat).mean(-1, keepdim=True)
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
    if mistake == "first dim only":
        d_w = (grad * xhat).sum(0)
    d_b = (rows * x_rows).sum(0) if mistake == "bias gets xhat" else rows.sum(0)
    return d_a, d_w, d_b


def embedding_backward(grad, idx, num_embeddings, mistake=None):
    D = grad.shape[-1]
    out = np.zeros((num_embeddings, D))
    idx, rows = idx.reshape(-1), grad.reshape(-1, D)
    if mistake == "fancy +=":
        out[idx] += rows
    elif mistake == "assign":
        out[idx] = rows
    elif mistake == "loop overwrites":
        for i, row in zip(idx, rows):
            out[i] = row
    elif mistake == "mean":
        np.add.at(out, idx, rows)
        out /= np.maximum(np.bincount(idx, minlength=num_embeddings), 1)[:, None]
    elif mistake == "1-D only":
        np.add.at(out, idx, grad)
    else:
        np.add.at(out, idx, rows)
    return Tensor(out, dtype=np.float64) if mistake is None else out


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

def test_checks_pass_on_references():
    expect_pass(check.layer_norm_backward, layer_norm_backward)
    expect_pass(check.embedding_backward, embedding_backward)
    expect_pass(check.causal_self_attention, causal_self_attention)


def test_numpy_results_are_accepted():
    expect_pass(check.embedding_backward, lambda g, i, v: embedding_backward(g, i, v).numpy())


# ---- and reject wrong ones ------------------------------------------------------------------------

def _stub(*args, **kwargs):
    raise NotImplementedError


@pytest.mark.parametrize("name", ["layer_norm_backward", "embedding_backward", "causal_self_attention"])
def test_stubs_fail(name):
    expect_failure(getattr(check, name), _stub, match="not implemented yet")


@pytest.mark.parametrize("mistake, match", [
    ("constant variance", "the variance depends on the input"),
    ("no mean", "the mean of g is missing"),
    ("no weight", "the gain is missing"),
    ("no r", "the factor r"),
    ("sums", "sums instead of means"),
    ("d_weight sum of grad", "sum of grad alone"),
    ("first dim only", "d_weight"),
    ("bias gets xhat", "the bias gets the sum of grad"),
])
def test_layer_norm_backward_mistakes(mistake, match):
    expect_failure(check.layer_norm_backward, lambda *a: layer_norm_backward(*a, mistake=mistake), match=match)


def test_layer_norm_backward_wrong_arity():
    expect_failure(check.layer_norm_backward, lambda *a: layer_norm_backward(*a)[:2], match="three gradients")


@pytest.mark.parametrize("mistake, match", [
    ("fancy +=", "write each row once"),
    ("assign", "write each row once"),
    ("loop overwrites", "write each row once"),
    ("mean", "the gradient is their sum"),
    ("1-D only", "raised"),
])
def test_embedding_backward_mistakes(mistake, match):
    expect_failure(check.embedding_backward, lambda *a: embedding_backward(*a, mistake=mistake), match=match)


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
