"""Checks for chapter 12, the capstone: chapter 04's GPT and its whole training, written on course_lib.tensor.

Each piece runs against chapter 04's PyTorch version (course_lib/gpt/) in float64, on random sizes:
- the fused Functions (softmax, GPT-2's GELU, layer norm, the embedding, masked fill, causal attention):
  forward and backward against torch's autograd; and what a fused op promises, tested directly: it is ONE
  node (its forward records no op of its own: an op mode watches it) and it keeps for its backward no more
  than it needs (the numbers its context holds, beyond its inputs, within a budget that every usual way
  of writing it fits);
- the Block and the GPT: chapter 04's parameter names, outputs and gradients from chapter 04's weights,
  chapter 04's initialisation (its statistics), a tied head, heads that do not divide the width refused;
- AdamW and its parameter groups, the schedule and clipping: against torch.optim.AdamW, chapter 04's
  lr_at and torch's clip_grad_norm_; a state that resumes exactly;
- checkpoints and the loop: chapter 04's `train` history, and a resumed run equal, bit for bit, to one that
  never stopped;
- sampling: the probabilities of chapter 04's temperature and top-k at every step, and the same tokens.
"""

import math
import os
import pickle
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

import course_lib.tensor as ct
from course_lib.checks import CheckFailed, assert_close, exercise, fmt, require, rng
from course_lib.gpt import trainer
from course_lib.gpt.data import Batches
from course_lib.gpt.generate import top_k_filter
from course_lib.gpt.model import GPT as TorchGPT
from course_lib.gpt.model import Block as TorchBlock
from course_lib.gpt.model import GPTConfig, causal_attention
from course_lib.gpt.trainer import Library, TrainConfig
from course_lib.tensor import autodiff, nn
from course_lib.tensor.tensor_data import TensorData


def _t(a):
    return torch.tensor(a, dtype=torch.float64, requires_grad=True)


def _ours(a, grad=True):
    return ct.Tensor(np.asarray(a, dtype=np.float64), requires_grad=grad, dtype=np.float64)


def _is_function(cls, name):
    require(isinstance(cls, type) and issubclass(cls, ct.Function),
            f"`{name}` should be a class derived from the library's Function, got {type(cls).__name__}.",
            hint="a class with a @staticmethod forward(ctx, ...) and a @staticmethod backward(ctx, grad), as "
                 "lesson 12 section 3 writes one")


# ---- what a fused op promises: one node, and a lean context ----------------------------------------

class _Recorder:
    """An op mode (autodiff.op_mode) that notes the ops applied inside a Function's forward while autograd
    records: each would be a node of its own, kept alive until the backward."""

    def __init__(self):
        self.depth, self.recorded = 0, []

    def apply(self, cls, inputs, kwargs, run):
        if self.depth and autodiff.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in inputs):
            self.recorded.append(cls.__name__)
        self.depth += 1
        try:
            return run()
        finally:
            self.depth -= 1

    def backward(self, cls, ctx, grad, run):
        return run()

    def read(self, tensor):
        pass


def _forward(cls, name, *inputs, **kwargs):
    """Apply your Function, watching its forward; the output Tensor and the context it filled."""
    recorder = _Recorder()
    with autodiff.op_mode(recorder):
        out = cls.apply(*inputs, **kwargs)
    require(isinstance(out, ct.Tensor), f"{name}.apply returned {type(out).__name__}.",
            hint="forward returns the raw data of its result, a TensorData (t.data of a Tensor t)")
    ops = sorted(set(recorder.recorded))
    require(not recorder.recorded,
            f"your {name}'s forward recorded {len(recorder.recorded)} ops of its own ({', '.join(ops)}): autograd "
            f"was on inside it, so each step became a node of the graph, and what each step keeps stays alive "
            f"until the backward. A fused op is ONE node, whatever it keeps on ctx.",
            hint="the steps inside a fused op's forward are not the graph's business: lesson 12, section 3, "
                 "shows how a forward keeps autograd out")
    require(out._ctx is not None, f"your {name}'s output carries no graph: does forward return the result's data?")
    return out, out._ctx


def _storages(value, found):
    """Every float array `value` keeps alive: {id of its memory: its size}. A view keeps its whole memory."""
    if isinstance(value, ct.Tensor):
        value = value.data
    if isinstance(value, TensorData):
        found[id(value.storage)] = value.storage.size
    elif isinstance(value, np.ndarray) and value.dtype.kind == "f":
        while isinstance(value.base, np.ndarray):
            value = value.base
        found[id(value)] = value.size
    elif isinstance(value, (tuple, list)):
        for v in value:
            _storages(v, found)
    elif isinstance(value, dict):
        for v in value.values():
            _storages(v, found)


def _kept(ctx, inputs):
    """How many numbers the context keeps alive besides its inputs' (the graph holds those anyway)."""
    found, theirs = {}, {}
    for value in vars(ctx).values():
        _storages(value, found)
    _storages(list(inputs), theirs)
    return sum(n for key, n in found.items() if key not in theirs)


def _lean(ctx, name, inputs, budget, what):
    kept = _kept(ctx, inputs)
    require(kept <= budget, f"your {name} keeps {kept:,} numbers on its context for the backward, besides its "
            f"inputs; {what} ({budget:,} numbers) are as much as any usual way of writing it needs.",
            hint="a fused op keeps what its backward multiplies by; every other step's result can go")


def _gradients(out, upstream, *inputs):
    """Backpropagate `upstream` from out; the gradient reaching each input (None where none did)."""
    for x in inputs:
        x.grad = None
    out.backward(ct.Tensor(upstream, dtype=np.float64))
    return [None if x.grad is None else x.grad.numpy() for x in inputs]


# ---- 1. softmax ------------------------------------------------------------------------------------

def _softmax_cases():
    cases = []
    shape = (int(rng().integers(2, 6)), int(rng().integers(3, 9)))
    cases.append((rng().normal(size=shape) * 3, 1))
    shape = (int(rng().integers(1, 4)), int(rng().integers(2, 6)), int(rng().integers(3, 8)))
    cases.append((rng().normal(size=shape) * 2, 1))                           # a dim that is not the last
    big = rng().normal(size=(3, 5)) * 5 + rng().choice([-1000.0, 1000.0], size=(3, 1))
    cases.append((big, 1))                                                    # exp would overflow
    T = int(rng().integers(3, 7))
    scores = rng().normal(size=(2, T, T))
    scores[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] = -np.inf   # attention's masked scores
    cases.append((scores, 2))
    return cases


@exercise
def softmax_function(your_Softmax):
    """Softmax: forward(ctx, a, dim) -> TensorData of exp(a) / sum(exp(a)) over dim; backward(ctx, grad)."""
    _is_function(your_Softmax, "Softmax")
    for a, dim in _softmax_cases():
        x, tx = _ours(a), _t(a)
        out, ctx = _forward(your_Softmax, "Softmax", x, dim=dim)
        want = torch.softmax(tx, dim)
        with np.errstate(all="ignore"):
            e = np.exp(a - np.max(a, axis=dim, keepdims=True))
            unshifted = np.exp(a) / np.exp(a).sum(dim, keepdims=True)
            other_dim = e / e.sum(axis=(dim + 1) % a.ndim, keepdims=True)
        assert_close(out.numpy(), want.detach().numpy(), what=f"softmax over dim {dim} of a {a.shape} input",
                     rtol=1e-10, atol=1e-12, inputs={"a": a},
                     mistakes={f"that is the softmax over another dim than the one given ({dim})": other_dim,
                               "exp overflowed on the logits of size 1000: a softmax does not change when a whole "
                               "row moves by one number, and that freedom keeps exp in range": unshifted})
        rows = a.size // a.shape[dim]
        _lean(ctx, "Softmax", [x], a.size + rows, "one array of the input's size and one number per row")
        upstream = rng().normal(size=a.shape)
        (mine,) = _gradients(out, upstream, x)
        want.backward(torch.from_numpy(upstream))
        s = want.detach().numpy()
        require(mine is not None, "no gradient reached the input: does backward return it?")
        with np.errstate(all="ignore"):
            log_softmax_rule = upstream - s * upstream.sum(dim, keepdims=True)
            no_inner = s * (upstream - upstream.sum(dim, keepdims=True))
        assert_close(mine, tx.grad.numpy(), what=f"the gradient of the input (dim {dim}, shape {a.shape})",
                     rtol=1e-9, atol=1e-12, inputs={"a": a, "grad": upstream},
                     mistakes={"that is the backward of log-softmax, the lesson's op: softmax's output is e / Z, "
                               "not a - log Z, and it enters the chain rule differently": log_softmax_rule,
                               "the sum over the row must weigh each entry's gradient by the path it came "
                               "through": no_inner})
    return "4 inputs (another dim than the last, logits of +-1000, masked rows with -inf); one node, a lean context"


# ---- 2. GPT-2's GELU -------------------------------------------------------------------------------

_C, _K = math.sqrt(2.0 / math.pi), 0.044715


@exercise
def gelu_function(your_GELU):
    """GELU: GPT-2's tanh form, 0.5 a (1 + tanh(c (a + k a^3))), as one Function with its derivative."""
    _is_function(your_GELU, "GELU")
    fixed = np.array([0.0, 1.0, -1.0, 2.5, -2.5, 5.0, -5.0, 30.0, -30.0, 1e-3])
    for a in (np.concatenate([fixed, rng().normal(size=7) * 3]).reshape(1, -1), rng().normal(size=(3, 4, 5)) * 2):
        x, tx = _ours(a), _t(a)
        out, ctx = _forward(your_GELU, "GELU", x)
        want = F.gelu(tx, approximate="tanh")
        t = np.tanh(_C * (a + _K * a**3))
        exact = F.gelu(torch.from_numpy(a)).numpy()
        assert_close(out.numpy(), want.detach().numpy(), what=f"GELU of a {a.shape} input", rtol=1e-10, atol=1e-12,
                     inputs={"a": a},
                     mistakes={"that is the exact GELU, a Phi(a) (torch's default); GPT-2's is the tanh form of "
                               "the exercise": exact,
                               "the cubic inside the tanh is missing": 0.5 * a * (1 + np.tanh(_C * a)),
                               "the factor one half is missing": a * (1 + t)})
        _lean(ctx, "GELU", [x], 2 * a.size, "two arrays of the input's size")
        upstream = rng().normal(size=a.shape)
        (mine,) = _gradients(out, upstream, x)
        want.backward(torch.from_numpy(upstream))
        require(mine is not None, "no gradient reached the input: does backward return it?")
        du = _C * (1 + 3 * _K * a**2)
        assert_close(mine, tx.grad.numpy(), what=f"the gradient of GELU's input ({a.shape})", rtol=1e-9, atol=1e-12,
                     inputs={"a": a, "grad": upstream},
                     mistakes={"only the first term of the product rule: a also multiplies a function of a":
                               upstream * 0.5 * (1 + t),
                               "the chain rule through the tanh's argument lost the cubic's own derivative":
                               upstream * (0.5 * (1 + t) + 0.5 * a * (1 - t * t) * _C),
                               "tanh's derivative is off (chapter 01 wrote it with tanh's output)":
                               upstream * (0.5 * (1 + t) + 0.5 * a * (1 - t) * du),
                               "the upstream gradient is missing: backward returns grad times the local derivative":
                               0.5 * (1 + t) + 0.5 * a * (1 - t * t) * du})
    return "fixed values (0, +-1, +-5, +-30) and random ones, against torch's gelu(approximate='tanh'); one node, " \
           "a lean context"


# ---- 3. layer norm -----------------------------------------------------------------------------------

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
        "the variance depends on the input too: its path back to the input is missing": r * (g - mean_g),
        "the mean that is subtracted depends on every input of the row: its path back is missing":
            r * (g - mean_gx * xhat),
        "the gain is missing from the gradient that reaches xhat": (
            r * (grad - grad.mean(-1, keepdims=True) - xhat * (grad * xhat).mean(-1, keepdims=True))),
        "every path into the input runs through the scaling by r, and the gradient does not":
            g - mean_g - xhat * mean_gx,
        "sums instead of means: a row's mean and variance divide by n, and so do their gradients": (
            r * (g - g.sum(-1, keepdims=True) - xhat * (g * xhat).sum(-1, keepdims=True))),
    }


@exercise
def layer_norm_function(your_LayerNorm):
    """LayerNorm: forward(ctx, a, weight, bias, eps) over the last dim; backward -> (d_a, d_weight, d_bias)."""
    _is_function(your_LayerNorm, "LayerNorm")
    shapes = [(int(rng().integers(2, 7)), int(rng().integers(3, 12))),
              (int(rng().integers(1, 4)), int(rng().integers(2, 6)), int(rng().integers(3, 12)))]
    for shape, eps in zip(shapes, (1e-5, float(rng().choice([0.1, 0.5])))):
        a, weight, bias, upstream, xhat, r = _layer_norm_case(shape, eps)
        ta, tw, tb = _t(a), _t(weight), _t(bias)
        want = F.layer_norm(ta, shape[-1:], tw, tb, eps=eps)
        x, w, b = _ours(a), _ours(weight), _ours(bias)
        out, ctx = _forward(your_LayerNorm, "LayerNorm", x, w, b, eps=eps)
        var = a.var(-1, keepdims=True)
        n = shape[-1]
        assert_close(out.numpy(), want.detach().numpy(), what=f"layer norm of a {shape} input (eps {eps})",
                     rtol=1e-9, atol=1e-12, inputs={"a": a, "weight": weight, "bias": bias, "eps": eps},
                     mistakes={"the variance is divided by n - 1: layer norm's divides by n (torch's unbiased=False)":
                               (a - a.mean(-1, keepdims=True)) / np.sqrt(var * n / (n - 1) + eps) * weight + bias,
                               "eps is added to the variance, under the square root":
                               (a - a.mean(-1, keepdims=True)) / (np.sqrt(var) + eps) * weight + bias,
                               "eps is not the one given: the check passes other values than 1e-5": (
                                   (a - a.mean(-1, keepdims=True)) / np.sqrt(var + 1e-5) * weight + bias),
                               "the bias is missing": xhat * weight,
                               "the gain is missing": xhat + bias})
        rows = a.size // n
        _lean(ctx, "LayerNorm", [x, w, b], a.size + 2 * rows, "one array of the input's size and two numbers per row")
        d_a, d_w, d_b = _gradients(out, upstream, x, w, b)
        want.backward(torch.from_numpy(upstream))
        inputs = {"a": a, "grad": upstream, "weight": weight}
        for mine, name in ((d_a, "d_a"), (d_w, "d_weight"), (d_b, "d_bias")):
            require(mine is not None, f"no gradient reached {name[2:]}: backward returns (d_a, d_weight, d_bias).")
        assert_close(d_a, ta.grad.numpy(), what=f"d_a for an input of shape {shape}", rtol=1e-7, atol=1e-9,
                     inputs=inputs, mistakes=_layer_norm_mistakes(upstream, xhat, r, weight))
        flat, x_flat = upstream.reshape(-1, n), xhat.reshape(-1, n)
        assert_close(d_w, tw.grad.numpy(), what=f"d_weight for an input of shape {shape}", rtol=1e-7, atol=1e-9,
                     inputs=inputs, hint="the gain is shared by every row (every dim but the last)",
                     mistakes={"that is the bias's gradient: the gain multiplies something on the way": flat.sum(0)})
        assert_close(d_b, tb.grad.numpy(), what=f"d_bias for an input of shape {shape}", rtol=1e-7, atol=1e-9,
                     inputs=inputs, hint="the bias is shared by every row (every dim but the last)",
                     mistakes={"that is the gain's gradient: the bias is added as it is": (flat * x_flat).sum(0)})
    return "a 2-D and a 3-D input, two eps, against PyTorch's layer_norm; one node, a lean context"


# ---- 4. the embedding: gather forward, scatter-add backward -------------------------------------------

@exercise
def embedding_function(your_Embedding):
    """Embedding: forward(ctx, weight, idx) -> weight[idx] (idx: an int array); backward -> d_weight."""
    _is_function(your_Embedding, "Embedding")
    cases = [(int(rng().integers(7, 15)),), (int(rng().integers(2, 4)), int(rng().integers(4, 9)))]
    for idx_shape in cases:
        V, D = int(rng().integers(4, 7)), int(rng().integers(2, 6))
        n = int(np.prod(idx_shape))
        idx = rng().integers(0, V - 1, size=idx_shape)          # row V-1 is never looked up
        flat = idx.reshape(-1)
        flat[rng().permutation(n)[:2]] = flat[0]                # and one row is looked up several times
        table = rng().normal(size=(V, D))
        upstream = rng().normal(size=idx_shape + (D,))
        tw = _t(table)
        want = F.embedding(torch.from_numpy(idx), tw)
        w = _ours(table)
        out, ctx = _forward(your_Embedding, "Embedding", w, idx=idx.copy())
        assert_close(out.numpy(), want.detach().numpy(), what=f"the rows looked up for idx of shape {idx_shape}",
                     rtol=0, atol=0, inputs={"idx": idx, "weight": table})
        _lean(ctx, "Embedding", [w], 0, "the indices (and the table's size)")
        (mine,) = _gradients(out, upstream, w)
        want.backward(torch.from_numpy(upstream))
        require(mine is not None, "no gradient reached the table: backward returns its gradient.")
        rows = upstream.reshape(-1, D)
        last_wins = np.zeros((V, D))
        last_wins[flat] = rows
        counts = np.maximum(np.bincount(flat, minlength=V), 1)[:, None]
        assert_close(mine, tw.grad.numpy(), what=f"the table's gradient for idx of shape {idx_shape}",
                     rtol=1e-9, atol=1e-12, inputs={"idx": idx, "num_embeddings": V, "grad": upstream},
                     mistakes={"rows looked up more than once kept one gradient, not their sum: with repeated "
                               "indices, numpy's fancy `+=` and `=` write each row once": last_wins,
                               "that is the mean over the positions of each row; the gradient is their sum":
                               tw.grad.numpy() / counts},
                     hint="row i of the gradient collects the gradient of every position whose index is i")
    return "1-D and 2-D indices with repeats and an unused row, against PyTorch's embedding; the indices kept"


# ---- 5. masked fill --------------------------------------------------------------------------------

@exercise
def masked_fill_function(your_MaskedFill):
    """MaskedFill: forward(ctx, a, mask, value) -> a with value where the 1.0/0.0 mask (broadcast) is 1."""
    _is_function(your_MaskedFill, "MaskedFill")
    B, H, T = int(rng().integers(1, 3)), int(rng().integers(1, 4)), int(rng().integers(3, 7))
    cases = [((B, H, T, T), np.triu(np.ones((T, T)), 1), float("-inf")),       # attention's causal mask
             ((B, T, 5), (rng().random((B, 1, 5)) < 0.5).astype(float), 2.5)]  # a finite value, another broadcast
    for shape, mask, value in cases:
        a = rng().normal(size=shape)
        upstream = rng().normal(size=shape)
        x, m = _ours(a), _ours(mask, grad=False)
        tx = _t(a)
        want = tx.masked_fill(torch.from_numpy(mask).bool(), value)
        out, ctx = _forward(your_MaskedFill, "MaskedFill", x, m, value=value)
        require(np.array_equal(x.numpy(), a), "your forward changed its input a in place; build a new result.")
        with np.errstate(invalid="ignore"):
            arithmetic = a * (1 - mask) + value * mask
        assert_close(out.numpy(), want.detach().numpy(), what=f"a {shape} filled with {value} under a {mask.shape} mask",
                     rtol=0, atol=0, inputs={"a": a, "mask": mask, "value": value},
                     mistakes={"arithmetic with the mask gives nan where it is 0 and value is -inf (-inf * 0 is nan): "
                               "the lesson's section 7 says why": arithmetic,
                               "the mask is the wrong way round: value goes where the mask is 1":
                               np.where(mask != 0, a, value)})
        require(np.isfinite(out.numpy()[np.broadcast_to(mask, shape) == 0]).all(),
                "where the mask is 0 your output is not a's number.")
        _lean(ctx, "MaskedFill", [x, m], mask.size, "one array of the mask's size")
        (mine,) = _gradients(out, upstream, x)
        want.backward(torch.from_numpy(upstream))
        require(mine is not None, "no gradient reached a: backward returns (d_a, None).")
        assert_close(mine, tx.grad.numpy(), what=f"the gradient of a ({shape}, mask {mask.shape})", rtol=0, atol=0,
                     inputs={"mask": mask, "grad": upstream},
                     mistakes={"the filled places got the gradient too: they hold the constant value, not a's "
                               "numbers": upstream,
                               "the gradient is kept where the mask is 1 and dropped where it is 0: the other way "
                               "round": np.where(np.broadcast_to(mask, shape) != 0, upstream, 0.0)})
    return "the causal mask with -inf on 4-D scores, a finite value under another broadcast mask; one node"


# ---- 6. causal attention, fused ------------------------------------------------------------------

def _heads(B, H, T, d, transposed):
    """q, k or v (B, H, T, d) as a leaf, or as the (B, T, H, d) leaf seen through transpose(1, 2) (as a GPT
    makes them); returns (what the Function gets, the leaf whose gradient is read, its array as (B, H, T, d))."""
    a = rng().normal(size=(B, H, T, d))
    if not transposed:
        leaf = _ours(a)
        return leaf, leaf, a
    leaf = _ours(np.ascontiguousarray(a.transpose(0, 2, 1, 3)))
    return leaf.transpose(1, 2), leaf, a


def _attention_mistakes(q, k, v, g, scale):
    """Wrong outputs and wrong gradients (dq, dk, dv) of the usual mistakes, in numpy."""
    T = q.shape[-2]
    future = np.triu(np.ones((T, T), dtype=bool), 1)

    def weights(scores, mask=future, dim=-1):
        s = np.where(mask, -np.inf, scores) if mask is not None else scores
        with np.errstate(invalid="ignore"):
            e = np.exp(s - s.max(dim, keepdims=True))
            return e / e.sum(dim, keepdims=True)

    kt = np.swapaxes(k, -1, -2)
    outs = {"no causal mask: a position must not see the positions after it": weights(q @ kt * scale, None) @ v,
            "the mask hides the diagonal too: a position sees itself": weights(
                q @ kt * scale, np.triu(np.ones((T, T), dtype=bool), 0)) @ v if T > 1 else None,
            "the scores are scaled by 1/d, not 1/sqrt(d)": weights(q @ kt / q.shape[-1]) @ v,
            "the scores are not scaled by 1/sqrt(d)": weights(q @ kt) @ v,
            "the softmax runs over the wrong dim: each query's row of weights sums to 1": weights(q @ kt * scale,
                                                                                                   dim=-2) @ v,
            "q and k are swapped: entry (i, j) of the scores is query i against key j": weights(k @ np.swapaxes(
                q, -1, -2) * scale) @ v}
    p = weights(q @ kt * scale)
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    grads = {"dq": {"the scores' scale is missing from the gradient of q": ds @ k,
                    "the softmax's backward lost its weighted row sum": (p * dp * scale) @ k},
             "dk": {"the scores' scale is missing from the gradient of k": np.swapaxes(ds, -1, -2) @ q,
                    "the gradient of k needs the weights' gradient transposed (keys are the scores' columns)":
                    (ds * scale) @ q},
             "dv": {"the gradient of v needs the weights transposed (each value is read by every query after it)":
                    p @ g}}
    return {h: o for h, o in outs.items() if o is not None}, grads


@exercise
def attention_function(your_CausalAttention):
    """CausalAttention: forward(ctx, q, k, v) -> softmax(q k^T / sqrt(d), causal) v for (B, H, T, d) inputs, as one
    node; backward -> (dq, dk, dv). Against chapter 04's `causal_attention` in PyTorch."""
    _is_function(your_CausalAttention, "CausalAttention")
    sizes = [(int(rng().integers(1, 3)), 1, int(rng().integers(3, 6)), int(rng().integers(3, 6)), False),
             (int(rng().integers(1, 3)), int(rng().integers(2, 4)), int(rng().integers(5, 9)), int(rng().integers(1, 4)),
              True),
             (2, 2, 9, 2, True)]    # many positions, few channels: what a context keeps shows
    for B, H, T, d, transposed in sizes:
        (q, q_leaf, qa), (k, k_leaf, ka), (v, v_leaf, va) = (_heads(B, H, T, d, transposed) for _ in range(3))
        tq, tk, tv = _t(qa), _t(ka), _t(va)
        want, _ = causal_attention(tq, tk, tv)
        inputs = {"q.shape": (B, H, T, d)}
        out, ctx = _forward(your_CausalAttention, "CausalAttention", q, k, v)
        scale = 1.0 / math.sqrt(d)
        g = rng().normal(size=(B, H, T, d))
        outs, grads = _attention_mistakes(qa, ka, va, g, scale)
        assert_close(out.numpy(), want.detach().numpy(), what=f"the output for q, k, v of shape {(B, H, T, d)}",
                     rtol=1e-9, atol=1e-12, inputs=inputs, mistakes=outs)
        _lean(ctx, "CausalAttention", [q, k, v, q_leaf, k_leaf, v_leaf], B * H * T * T + B * H * T * d + B * H * T + T * T,
              "the weights (B, H, T, T), one array of the output's size, one number per query and a (T, T) mask")
        mine = _gradients(out, g, q_leaf, k_leaf, v_leaf)
        want.backward(torch.from_numpy(g))
        for name, grad, leaf, theirs in zip(("dq", "dk", "dv"), mine, (q_leaf, k_leaf, v_leaf), (tq, tk, tv)):
            require(grad is not None, f"no gradient reached {name[1:]}: backward returns (dq, dk, dv).")
            if transposed:
                grad = grad.transpose(0, 2, 1, 3)
            assert_close(grad, theirs.grad.numpy(), what=f"{name} for q, k, v of shape {(B, H, T, d)}", rtol=1e-8,
                         atol=1e-10, inputs=inputs, mistakes=grads[name],
                         hint="walk the forward's steps back from the output: the product with v, the softmax "
                              "(your exercise 1), the scaled product of q and k")
    return "3 shapes (1 to 3 heads, transposed views as a GPT makes them), against chapter 04's causal_attention; " \
           "one node, a lean context"


# ---- 7. the block ------------------------------------------------------------------------------------

def _config(n_layer, heads=(1, 3)):
    """A small random GPTConfig of odd sizes: heads (as many as `heads` allows) that divide the width."""
    H = int(rng().integers(heads[0], heads[1] + 1))
    d = int(rng().integers(2, 6))
    return GPTConfig(vocab_size=int(rng().integers(11, 30)), block_size=int(rng().integers(5, 12)),
                     n_layer=n_layer, n_head=H, n_embd=H * d, dropout=0.0)


def _jostled(torch_module):
    """The module with every parameter drawn anew (gains and biases too, so none is 1 or 0)."""
    with torch.no_grad():
        for name, p in torch_module.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.ndim > 1 else 0.5) + (1.0 if name.endswith("ln_1.weight")
                                                                            or name.endswith("ln_2.weight") else 0.0))
    return torch_module


def _require_refused(build, what):
    config = GPTConfig(vocab_size=13, block_size=8, n_layer=1, n_head=3, n_embd=10, dropout=0.0)
    try:
        build(config, np.float64)
    except (ValueError, AssertionError) as e:
        require(str(e).strip(), f"your {what} refused n_embd = 10 with n_head = 3, but its error says nothing: "
                "say which sizes do not fit, so that whoever made the config knows what to change.")
        return
    raise CheckFailed(f"your {what} was built with n_embd = 10 and n_head = 3: heads that do not divide the width "
                      "would each get a fraction of a channel. Refuse such a config when the model is built "
                      "(a ValueError, or an assertion, whose message says why).")


def _torch_block_variants(block, x):
    """Wrong outputs of a Block, computed with chapter 04's torch modules: {hint: output}."""
    import torch.nn as tnn

    def post(x):
        x = block.ln_1(x + block.attn(x))
        return block.ln_2(x + block.mlp(x))

    def exact_gelu(x):
        y = x + block.attn(block.ln_1(x))
        h = block.mlp.c_proj(tnn.functional.gelu(block.mlp.c_fc(block.ln_2(y))))
        return y + h

    with torch.no_grad():
        out = {"the residual is added after the norm (post-norm): in a pre-norm block the norm reads a copy of "
               "x for its sublayer, and the sublayer's output is added to x itself": post(x),
               "the MLP's GELU is the exact one; chapter 04's GPT uses GPT-2's tanh form": exact_gelu(x),
               "the residual of the MLP is missing": (lambda y: block.mlp(block.ln_2(y)))(x + block.attn(block.ln_1(x))),
               "the residual of the attention is missing": (lambda y: y + block.mlp(block.ln_2(y)))(
                   block.attn(block.ln_1(x))),
               "the two norms are swapped": (lambda y: y + block.mlp(block.ln_1(y)))(x + block.attn(block.ln_2(x)))}
    return {hint: y.numpy() for hint, y in out.items()}


def _same_module(yours, theirs, what):
    """Load `theirs` (torch) into `yours` by name; checks the names (a tied matrix under each of its names),
    shapes and dtypes first."""
    mine = {name: tuple(np.shape(a)) for name, a in yours.state_dict().items()}
    want = {name: tuple(t.shape) for name, t in theirs.state_dict().items()}
    missing, extra = sorted(set(want) - set(mine)), sorted(set(mine) - set(want))
    require(not missing and not extra, f"your {what}'s parameters are not named as chapter 04's: missing "
            f"{missing[:6]}, unexpected {extra[:6]}.",
            hint="chapter 04's names (lesson 04) let a state dict of its GPT load into yours; a sub-module's "
                 "attribute name becomes part of its parameters' names")
    for name in want:
        require(mine[name] == want[name], f"your {what}'s {name} has shape {mine[name]}, chapter 04's {want[name]}.")
    dtypes = {np.dtype(p.dtype).name for p in yours.parameters()}
    require(dtypes == {"float64"}, f"your {what} built with dtype float64 has parameters of dtype {sorted(dtypes)}: "
            "every layer takes the dtype it is given.")
    yours.load_state_dict({n: p.detach().numpy() for n, p in theirs.state_dict().items()})


@exercise
def block(your_Block):
    """Block(config, dtype): chapter 04's pre-norm transformer block (ln_1, attn, ln_2, mlp) on the library."""
    _require_refused(your_Block, "Block")
    for heads in ((1, 3), (2, 4)):                 # the second has heads to mix up
        config = _config(1, heads)
        torch.manual_seed(int(rng().integers(2**31)))
        theirs = _jostled(TorchBlock(config).double())
        yours = your_Block(config, np.float64)
        _same_module(yours, theirs, "Block")
        B, T = int(rng().integers(1, 4)), int(rng().integers(3, config.block_size + 1))
        x = rng().normal(size=(B, T, config.n_embd))
        tx = _t(x)
        want = theirs(tx)
        x_ours = _ours(x)
        out = yours(x_ours)
        require(isinstance(out, ct.Tensor), f"your Block returned {type(out).__name__}, not a course Tensor.")
        inputs = {"x.shape": (B, T, config.n_embd), "n_head": config.n_head}
        assert_close(out.numpy(), want.detach().numpy(), what=f"the Block's output ({config.n_head} heads)", rtol=1e-9,
                     atol=1e-11, inputs=inputs, mistakes=_torch_block_variants(theirs, tx.detach()))
        g = rng().normal(size=x.shape)
        out.backward(ct.Tensor(g, dtype=np.float64))
        want.backward(torch.from_numpy(g))
        require(x_ours.grad is not None, "no gradient reached the Block's input x.")
        assert_close(x_ours.grad.numpy(), tx.grad.numpy(), what="the gradient of x", rtol=1e-8, atol=1e-10,
                     inputs=inputs)
        named = dict(theirs.named_parameters())
        for name, p in yours.named_parameters():
            require(p.grad is not None, f"no gradient reached {name}.")
            assert_close(p.grad.numpy(), named[name].grad.numpy(), what=f"the gradient of {name}", rtol=1e-8,
                         atol=1e-10, inputs=inputs)
    return "2 random sizes, 1 to 4 heads: names, output and every gradient against chapter 04's Block; an " \
           "uneven split of heads refused"


# ---- 8. the GPT ------------------------------------------------------------------------------------------

def _init_statistics(your_GPT):
    """Chapter 04's initialisation, by its statistics on a GPT large enough to show them."""
    config = GPTConfig(vocab_size=67, block_size=29, n_layer=3, n_head=4, n_embd=48, dropout=0.0)
    ct.manual_seed(int(rng().integers(2**31)))
    model = your_GPT(config, np.float64)
    residual = 0.02 / math.sqrt(2 * config.n_layer)
    for name, p in model.named_parameters():
        a = p.numpy()
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            require(np.all(a == 1.0), f"your fresh GPT's {name} is not all 1: a layer norm starts as the identity.")
        elif name.endswith(".bias"):
            require(np.all(a == 0.0), f"your fresh GPT's {name} is not all 0: chapter 04 starts every bias at 0.")
        else:
            std = residual if name.endswith("c_proj.weight") else 0.02
            hint = ("the projections into the residual stream (c_proj) start smaller, by the number of residual "
                    "additions (lesson 04)" if name.endswith("c_proj.weight") else
                    "chapter 04 draws every other matrix, embeddings included, from one normal distribution")
            require(abs(a.std() - std) < 0.1 * std and abs(a.mean()) < 5 * std / math.sqrt(a.size),
                    f"your fresh GPT's {name} has mean {a.mean():.4f} and standard deviation {a.std():.4f}; chapter "
                    f"04's are 0 and {std:.4f} (n_layer = {config.n_layer}).", hint=hint)


@exercise
def gpt(your_GPT):
    """GPT(config, dtype): embeddings, blocks, final norm, a head tied to the token embedding, chapter 04's init;
    forward(idx, targets=None) -> (logits, loss)."""
    _require_refused(your_GPT, "GPT")
    _init_statistics(your_GPT)
    for n_layer, heads in ((1, (1, 3)), (3, (2, 4))):
        config = _config(n_layer, heads)
        torch.manual_seed(int(rng().integers(2**31)))
        theirs = _jostled(TorchGPT(config).double())
        yours = your_GPT(config, np.float64)
        require(getattr(yours, "lm_head", None) is not None and getattr(yours, "transformer", None) is not None,
                "your GPT needs chapter 04's attributes: transformer (wte, wpe, h, ln_f) and lm_head.")
        require(yours.lm_head.weight is yours.transformer.wte.weight,
                "your GPT's head is not tied: lm_head holds a matrix of its own. In chapter 04's GPT one matrix "
                "reads tokens in (the embedding) and writes them out (the head).")
        _same_module(yours, theirs, "GPT")
        B, T = int(rng().integers(1, 4)), int(rng().integers(2, config.block_size + 1))
        idx = rng().integers(0, config.vocab_size, (B, T))
        targets = rng().integers(0, config.vocab_size, (B, T))
        want_logits, want_loss = theirs(torch.from_numpy(idx), torch.from_numpy(targets))
        result = yours(idx, targets)
        require(isinstance(result, tuple) and len(result) == 2, "forward(idx, targets) returns (logits, loss).")
        logits, loss = result
        inputs = {"idx.shape": (B, T), "n_layer": n_layer, "n_head": config.n_head, "n_embd": config.n_embd}
        assert_close(logits.numpy(), want_logits.detach().numpy(), what=f"the logits ({n_layer} layers)", rtol=1e-9,
                     atol=1e-11, inputs=inputs)
        require(loss is not None and np.shape(loss.numpy()) in ((), (1,)),
                "with targets, the loss is the mean cross-entropy over every position, one number.")
        assert_close(loss.item(), want_loss.item(), what="the loss", rtol=1e-10, atol=1e-12, inputs=inputs)
        loss.backward()
        want_loss.backward()
        named = dict(theirs.named_parameters(remove_duplicate=False))
        for name, p in yours.named_parameters():
            require(p.grad is not None, f"no gradient reached {name}.")
            assert_close(p.grad.numpy(), named[name].grad.numpy(), what=f"the gradient of {name}", rtol=1e-8,
                         atol=1e-10, inputs=inputs)
        plain = yours(idx[:, :T])
        require(isinstance(plain, tuple) and plain[1] is None, "forward(idx) without targets returns (logits, None).")
        too_long = rng().integers(0, config.vocab_size, (1, config.block_size + 1))
        try:
            yours(too_long)
        except (ValueError, AssertionError, IndexError):
            pass
        else:
            raise CheckFailed(f"your GPT ran on {config.block_size + 1} positions with block_size = "
                              f"{config.block_size}: it learned no position past block_size, so refuse a longer "
                              "sequence (an error that says so).")
    return "chapter 04's init (its statistics), a tied head; 1 and 3 layers of odd sizes: names, logits, loss " \
           "and every gradient against chapter 04's GPT; too long a sequence refused"


# ---- 9. AdamW and its parameter groups -----------------------------------------------------------------

def _adam_step(p, g, m, v, t, lr, b1, b2, eps):
    """Chapter 02's Adam step (numpy), the one the check hands your AdamW."""
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    return p - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps), m, v


class _Counted:
    """An adam_step that counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        return _adam_step(*args)


class _Tiny(nn.Module):
    """A small model of the library's layers, with matrices, biases and a layer norm."""

    def __init__(self, V, C):
        super().__init__()
        self.wte = nn.Embedding(V, C, dtype=np.float64)
        self.ln = nn.LayerNorm(C, dtype=np.float64)
        self.head = nn.Linear(C, V, dtype=np.float64)

    def forward(self, idx, targets=None):
        idx = np.asarray(idx)
        logits = self.head(self.ln(self.wte(idx)))
        loss = None if targets is None else ct.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                             np.asarray(targets).reshape(-1))
        return logits, loss


class _TorchTiny(torch.nn.Module):
    def __init__(self, tiny):
        super().__init__()
        V, C = tiny.wte.weight.shape
        self.wte, self.ln, self.head = torch.nn.Embedding(V, C), torch.nn.LayerNorm(C), torch.nn.Linear(C, V)
        self.double()
        self.load_state_dict({k: torch.from_numpy(v) for k, v in tiny.state_dict().items()})

    def forward(self, idx, targets=None):
        logits = self.head(self.ln(self.wte(idx)))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def _check_groups(your_param_groups):
    V, C = int(rng().integers(5, 12)), int(rng().integers(3, 8))
    model = _Tiny(V, C)
    wd = float(rng().uniform(0.05, 0.3))
    groups = your_param_groups(model, wd)
    require(isinstance(groups, (list, tuple)) and all(isinstance(g, dict) and "params" in g for g in groups),
            "param_groups returns a list of groups, each a dict with \"params\" (and its \"weight_decay\").")
    names = {id(p): n for n, p in model.named_parameters()}
    seen = [id(p) for g in groups for p in g["params"]]
    require(sorted(seen) == sorted(names), "every parameter of the model belongs to exactly one group "
            f"(yours list {len(seen)} parameters, {len(set(seen))} of them different; the model has {len(names)}).")
    for g in groups:
        for p in g["params"]:
            decay = g.get("weight_decay", None)
            if p.ndim >= 2:
                require(decay == wd, f"{names[id(p)]}, a matrix, is in a group whose weight_decay is {decay}, "
                        f"not the {wd:.4f} given.")
            else:
                kind = "a layer norm's" if names[id(p)].startswith("ln.") else "a"
                require(decay == 0.0, f"{names[id(p)]}, {kind} vector, is in a group that decays "
                        f"(weight_decay {decay}): decay pulls every number toward 0, and a gain or a bias has no "
                        "reason to be small (lesson 04).")


def _param_twins(shapes):
    arrays = [rng().normal(size=s) for s in shapes]
    ours = [nn.Parameter(a, dtype=np.float64) for a in arrays]
    theirs = [torch.nn.Parameter(torch.tensor(a)) for a in arrays]
    return ours, theirs


def _optimizer_mistakes(groups_theirs, betas, eps, grads_seq, lrs):
    """Parameters after the steps of the usual mistakes: {hint: flat array}."""
    def run(kind):
        params = [[p.detach().clone() for p in g["params"]] for g in groups_theirs]
        state = {}
        for step, grads in enumerate(grads_seq):
            for gi, (group, ps) in enumerate(zip(groups_theirs, params)):
                lr, wd = lrs[step][gi], group["weight_decay"]
                for pi, p in enumerate(ps):
                    g = grads[gi][pi]
                    if g is None:
                        continue
                    m, v, t = state.get((gi, pi), (0.0, 0.0, 0))
                    g = g + wd * p if kind == "coupled" else g
                    m, v, t = betas[0] * m + (1 - betas[0]) * g, betas[1] * v + (1 - betas[1]) * g * g, t + 1
                    state[(gi, pi)] = (m, v, t)
                    update = lr * (m / (1 - betas[0] ** t)) / ((v / (1 - betas[1] ** t)).sqrt() + eps)
                    if kind == "decay after":
                        p.copy_((p - update) * (1 - lr * wd))
                    elif kind == "coupled":
                        p.copy_(p - update)
                    elif kind == "first lr":
                        lr0 = lrs[0][gi]
                        p.copy_(p * (1 - lr0 * wd) - lr0 * (m / (1 - betas[0] ** t)) /
                                ((v / (1 - betas[1] ** t)).sqrt() + eps))
        return np.concatenate([p.numpy().reshape(-1) for ps in params for p in ps])

    return {"the decay is folded into the gradient, as Adam's L2 penalty: AdamW's decoupled decay shrinks the "
            "weights apart from the gradient": run("coupled"),
            "the weights shrink after the Adam step; AdamW (torch's) shrinks them before it": run("decay after"),
            "every step used the first learning rate: a schedule changes each group's \"lr\" between steps, "
            "and a step reads it then": run("first lr")}


@exercise
def adamw(your_param_groups, your_AdamW):
    """param_groups(model, weight_decay) -> groups; AdamW(params or groups, lr, betas, eps, weight_decay, adam_step)
    with torch's interface (param_groups, zero_grad, step, state_dict, load_state_dict), against torch's AdamW."""
    _check_groups(your_param_groups)
    betas, eps = (float(rng().uniform(0.7, 0.9)), float(rng().uniform(0.9, 0.99))), float(rng().choice([1e-8, 1e-6]))
    shapes = [(int(rng().integers(2, 6)), int(rng().integers(2, 6))), (int(rng().integers(2, 7)),),
              (int(rng().integers(2, 5)), int(rng().integers(1, 4))), (int(rng().integers(1, 6)),)]
    ours, theirs = _param_twins(shapes)
    wds = (float(rng().uniform(0.05, 0.5)), 0.0)
    base_lr = float(rng().uniform(0.01, 0.1))
    counted = _Counted()
    opt = your_AdamW([{"params": ours[:2], "weight_decay": wds[0]}, {"params": ours[2:], "weight_decay": wds[1],
                                                                        "lr": base_lr / 2}],
                     lr=base_lr, betas=betas, eps=eps, weight_decay=0.3, adam_step=counted)
    groups_t = [{"params": theirs[:2], "weight_decay": wds[0]}, {"params": theirs[2:], "weight_decay": wds[1],
                                                                   "lr": base_lr / 2}]
    ref = torch.optim.AdamW(groups_t, lr=base_lr, betas=betas, eps=eps, weight_decay=0.3)
    require(hasattr(opt, "param_groups") and len(opt.param_groups) == 2,
            "your AdamW keeps the groups it is given in `param_groups`, as torch's does.")
    grads_seq, lrs = [], []
    for step in range(5):
        grads = [rng().normal(size=s) for s in shapes]
        if step == 2:
            grads[3] = None                             # a parameter without a gradient this step
        for p, q, g in zip(ours, theirs, grads):
            p.grad = None if g is None else ct.Tensor(g, dtype=np.float64)
            q.grad = None if g is None else torch.tensor(g)
        lr = float(rng().uniform(0.01, 0.1))
        lrs.append((lr, lr / 3))
        for o, t, value in zip(opt.param_groups, ref.param_groups, (lr, lr / 3)):
            o["lr"] = t["lr"] = value                   # a schedule, between steps
        grads_seq.append([[None if g is None else torch.tensor(g) for g in grads[:2]],
                          [None if g is None else torch.tensor(g) for g in grads[2:]]])
        opt.step()
        ref.step()
        yours = np.concatenate([p.numpy().reshape(-1) for p in ours])
        want = np.concatenate([p.detach().numpy().reshape(-1) for p in theirs])
        assert_close(yours, want, what=f"the parameters after step {step + 1} (all of them, flattened)", rtol=1e-10,
                     atol=1e-12, inputs={"shapes": shapes, "weight_decay of the groups": wds, "betas": betas},
                     mistakes=_optimizer_mistakes(groups_t, betas, eps, grads_seq, lrs) if step == 4 else None,
                     hint="torch's AdamW: the group's own lr and weight_decay, the decay apart from the gradient, "
                          "a parameter without a gradient left alone")
    require(counted.calls >= 5,
            "your AdamW did not run the adam_step it was given: its moments are chapter 02's step.")
    opt.zero_grad(set_to_none=True)
    require(all(p.grad is None for p in ours), "zero_grad(set_to_none=True) leaves every gradient None, as torch's.")
    # a state that resumes: saved (as a checkpoint would, through pickle), loaded into a new optimizer
    saved = pickle.loads(pickle.dumps(opt.state_dict()))
    twins = [nn.Parameter(p.numpy(), dtype=np.float64) for p in ours]
    resumed = your_AdamW([{"params": twins[:2], "weight_decay": wds[0]}, {"params": twins[2:], "weight_decay": wds[1]}],
                         lr=base_lr, betas=betas, eps=eps, weight_decay=0.3, adam_step=_adam_step)
    resumed.load_state_dict(saved)
    for _ in range(2):
        grads = [rng().normal(size=s) for s in shapes]
        for a, b, g in zip(ours, twins, grads):
            a.grad, b.grad = ct.Tensor(g, dtype=np.float64), ct.Tensor(g, dtype=np.float64)
        for o, r in zip(opt.param_groups, resumed.param_groups):
            o["lr"] = r["lr"] = 0.05
        opt.step()
        resumed.step()
    same = all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(ours, twins))
    require(same, "an AdamW made afresh and given load_state_dict(state_dict()) of yours takes other steps than "
            "yours: the state it saves, or puts back, misses something a step reads (each parameter's moments, "
            "its step count).", hint="lesson 12, section 11: what the next step reads")
    return "two groups with their own lr and decay, 5 steps with a schedule, against torch.optim.AdamW; groups that " \
           "leave vectors undecayed; a state that resumes exactly"


# ---- 10. the schedule ------------------------------------------------------------------------------------

@exercise
def lr_schedule(your_lr_at):
    """lr_at(it, cfg): warmup then cosine, chapter 04's schedule (its own formula here, over all steps at once)."""
    cases = []
    for warmup in (int(rng().integers(2, 9)), 1):
        decay = warmup + int(rng().integers(5, 30))
        cases.append(TrainConfig(lr=float(rng().uniform(1e-3, 1e-2)), min_lr=float(rng().uniform(1e-5, 1e-4)),
                                 warmup_iters=warmup, lr_decay_iters=decay))
    for cfg in cases:
        its = list(range(cfg.lr_decay_iters + 5))
        yours = np.array([your_lr_at(it, cfg) for it in its], dtype=np.float64)
        w, d = cfg.warmup_iters, cfg.lr_decay_iters
        steps = np.array(its, dtype=np.float64)
        share = np.clip((steps - w) / (d - w), 0.0, 1.0)          # how far down the cosine, 0 to 1
        want = np.where(steps < w, cfg.lr * (steps + 1) / w,
                        cfg.min_lr + (cfg.lr - cfg.min_lr) * (1.0 + np.cos(np.pi * share)) / 2)
        progress = lambda it: (it - w) / (d - w)    # noqa: E731
        mistakes = {
            "the warmup is one step late: step 0 already trains, with its share of the rate, and the last warmup "
            "step reaches cfg.lr": [cfg.lr * it / w if it < w else want[it] for it in its],
            "the cosine ends at 0 instead of min_lr": [want[it] if it < w else 0.5 * (1 + math.cos(math.pi * min(
                progress(it), 1))) * cfg.lr for it in its],
            "the cosine runs over the steps since step 0, not since the end of the warmup": [
                want[it] if it < w or it >= d else cfg.min_lr + 0.5 * (1 + math.cos(math.pi * it / d)) * (cfg.lr - cfg.min_lr)
                for it in its]}
        assert_close(yours, want, what=f"the rates of steps 0 to {its[-1]}", rtol=1e-12, atol=0,
                     inputs={"lr": cfg.lr, "min_lr": cfg.min_lr, "warmup_iters": w, "lr_decay_iters": d},
                     mistakes=mistakes)
    return "two schedules (a warmup of one step too), every step to past lr_decay_iters, against chapter 04's lr_at"


# ---- 11. clipping --------------------------------------------------------------------------------------

@exercise
def clip_grad_norm(your_clip_grad_norm):
    """clip_grad_norm(params, max_norm) -> the global norm before clipping; scales every grad by one factor."""
    for above in (True, False):
        shapes = [(int(rng().integers(2, 6)), int(rng().integers(2, 6))), (int(rng().integers(2, 9)),),
                  (int(rng().integers(1, 5)), int(rng().integers(1, 5)), 2), (3,)]
        ours, theirs = _param_twins(shapes)
        grads = [rng().normal(size=s) * rng().uniform(0.2, 3.0) for s in shapes]
        grads[3] = None                                           # a parameter without a gradient
        for p, q, g in zip(ours, theirs, grads):
            p.grad = None if g is None else ct.Tensor(g, dtype=np.float64)
            q.grad = None if g is None else torch.tensor(g)
        norm = math.sqrt(sum((g * g).sum() for g in grads if g is not None))
        per = [math.sqrt((g * g).sum()) for g in grads if g is not None]
        max_norm = float(rng().uniform(0.3, 0.7) * min(per)) if above else norm * float(rng().uniform(1.2, 2.0))
        yours = your_clip_grad_norm(ours, max_norm)
        want = torch.nn.utils.clip_grad_norm_(theirs, max_norm).item()
        require(yours is not None, "clip_grad_norm returns the global norm of the gradients, before clipping.")
        assert_close(float(yours), want, what="the norm returned", rtol=1e-12, atol=0,
                     hint="one norm for every gradient together, as if they were one long vector, measured before "
                          "any scaling")
        mine = np.concatenate([p.grad.numpy().reshape(-1) for p in ours if p.grad is not None])
        expected = np.concatenate([q.grad.numpy().reshape(-1) for q in theirs if q.grad is not None])
        require(ours[3].grad is None, "a parameter without a gradient keeps None.")
        each = np.concatenate([(g * min(1.0, max_norm / (math.sqrt((g * g).sum()) + 1e-6))).reshape(-1)
                               for g in grads if g is not None])
        up = np.concatenate([(g * max_norm / (norm + 1e-6)).reshape(-1) for g in grads if g is not None])
        assert_close(mine, expected, what=f"the gradients after clipping ({'above' if above else 'below'} max_norm; "
                     "all of them, flattened)", rtol=1e-12, atol=1e-15,
                     inputs={"max_norm": max_norm, "global norm": norm},
                     mistakes={"each gradient was clipped by its own norm: clipping by the global norm scales all of "
                               "them by one factor, so the whole gradient keeps its direction": each,
                               "gradients already below max_norm were scaled up: clipping only ever shrinks": up})
    return "4 parameters (one without a gradient), above and below max_norm, against torch's clip_grad_norm_"


# ---- 12. checkpoints ---------------------------------------------------------------------------------

class _Momentum:
    """SGD with momentum on the library (v = mu v + g, p -= lr v, torch's), with torch's interface: what the
    checks of chapter 12's loop use as the optimizer, so that they test the loop and the checkpoint alone."""

    def __init__(self, params, lr=0.1, momentum=0.9):
        self.param_groups = [{"params": list(params), "lr": lr}]
        self.momentum, self.state = momentum, {}

    def zero_grad(self, set_to_none=True):
        for p in self.param_groups[0]["params"]:
            p.grad = None

    def step(self):
        group = self.param_groups[0]
        for i, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            g = p.grad.numpy()
            v = self.state[i] = g if i not in self.state else self.momentum * self.state[i] + g
            p.copy_(ct.Tensor(p.numpy() - group["lr"] * v, dtype=p.dtype))

    def state_dict(self):
        return {"state": {i: v.copy() for i, v in self.state.items()}, "lr": self.param_groups[0]["lr"]}

    def load_state_dict(self, state):
        self.state = {i: np.array(v) for i, v in state["state"].items()}
        self.param_groups[0]["lr"] = state["lr"]


def _no_clipping(params, max_norm):
    raise AssertionError("the checks of chapter 12's loop and checkpoints train without clipping (grad_clip 0)")


LIBRARY = Library("course_lib.tensor", _Momentum, _no_clipping, ct.no_grad)


def _run(model, opt, batches, steps):
    return [float(trainer.train_step(model, opt, *batches.get("train"), 0.0, LIBRARY)) for _ in range(steps)]


def _flat(model):
    return np.concatenate([p.numpy().reshape(-1) for p in model.parameters()])


def _setting():
    V, C, T, B = int(rng().integers(7, 13)), int(rng().integers(3, 7)), int(rng().integers(4, 8)), int(rng().integers(2, 4))
    tokens = rng().integers(0, V, int(rng().integers(200, 300)))
    return V, C, T, B, tokens


@exercise
def checkpoint(your_save_checkpoint, your_load_checkpoint):
    """save_checkpoint(path, it, model, optimizer, batches); load_checkpoint(path, model, optimizer, batches) -> it:
    a run resumed from the file goes on exactly as the run that saved it."""
    V, C, T, B, tokens = _setting()
    seed = int(rng().integers(2**31))
    ct.manual_seed(seed)
    model, k, more = _Tiny(V, C), int(rng().integers(2, 5)), 3
    opt, batches = _Momentum(model.parameters(), lr=0.2), Batches(tokens, T, B, seed=seed)
    _run(model, opt, batches, k)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "checkpoint.pkl")
        your_save_checkpoint(path, k, model, opt, batches)
        require(os.path.exists(path), f"save_checkpoint wrote nothing at {path}.")
        weights, moments = _flat(model), {i: v.copy() for i, v in opt.state.items()}
        draws = batches.rng.bit_generator.state
        after = _run(model, opt, batches, more)
        ct.manual_seed(seed + 1)
        other = _Tiny(V, C)                                             # other weights, no moments, other draws
        other_opt, other_batches = _Momentum(other.parameters(), lr=0.2), Batches(tokens, T, B, seed=seed + 1)
        it = your_load_checkpoint(path, other, other_opt, other_batches)
    require(it == k, f"load_checkpoint returned {it!r}; the checkpoint was saved after {k} steps.")
    require(np.array_equal(_flat(other), weights), "after load_checkpoint the weights are not those saved.")
    require(set(other_opt.state) == set(moments) and all(np.array_equal(other_opt.state[i], moments[i]) for i in moments),
            "after load_checkpoint the optimizer's state is not the one saved: the next step reads the moments "
            "(here momentum buffers) as much as the weights.", hint="lesson 12, section 11: what the next step reads")
    require(other_batches.rng.bit_generator.state == draws,
            "after load_checkpoint the batches' generator is not where it stood: the resumed run would train on "
            "other batches than the run that saved it.", hint="lesson 12, section 11: where the draws stand")
    resumed = _run(other, other_opt, other_batches, more)
    require(resumed == after and np.array_equal(_flat(other), _flat(model)),
            "the run resumed from your checkpoint differs from the run that saved it.")
    return "a few steps, saved, 3 more; a model of other weights, a fresh optimizer and other draws loaded from " \
           "the file take the same steps, bit for bit"


# ---- 13. the loop ---------------------------------------------------------------------------------------

def _torch_batches(batches):
    return lambda split: tuple(torch.from_numpy(a) for a in batches.get(split))


@exercise
def train(your_train):
    """train(model, optimizer, batches, cfg, lib, checkpoint=None, save_every=0, resume=False) -> chapter 04's
    history; with checkpoint and save_every it saves, with resume it goes on from the checkpoint."""
    V, C, T, B, tokens = _setting()
    seed = int(rng().integers(2**31))
    warmup = int(rng().integers(2, 4))
    cfg = TrainConfig(max_iters=8, batch_size=B, lr=0.3, min_lr=0.03, warmup_iters=warmup, lr_decay_iters=7,
                      eval_interval=3, eval_iters=2, grad_clip=0.0, seed=seed)
    ct.manual_seed(seed)
    model = _Tiny(V, C)
    theirs = _TorchTiny(model)
    start = _flat(model)
    want = trainer.train(theirs, _torch_batches(Batches(tokens, T, B, seed=seed)), cfg, progress=False,
                         optimizer=torch.optim.SGD(theirs.parameters(), lr=cfg.lr, momentum=0.9))
    history = your_train(model, _Momentum(model.parameters(), lr=cfg.lr), Batches(tokens, T, B, seed=seed), cfg, LIBRARY)
    require(isinstance(history, dict), f"train returns chapter 04's history, a dict; got {type(history).__name__}.")
    inputs = {"max_iters": cfg.max_iters, "eval_interval": cfg.eval_interval, "warmup_iters": warmup}
    for key in ("iter", "lr", "loss", "eval_iter", "train_loss", "val_loss"):
        require(key in history, f"the history has no {key!r}: chapter 04's has iter, lr, loss, eval_iter, train_loss, "
                "val_loss.")
        mistakes = {}
        if key == "lr":
            mistakes["the rate of step it is the schedule's value at step it + 1"] = want["lr"][1:] + [want["lr"][-1]]
        if key in ("eval_iter", "train_loss", "val_loss") and len(history[key]) != len(want[key]):
            raise CheckFailed(f"your history has {len(history[key])} evaluations, chapter 04's {len(want[key])} (at "
                              f"steps {want['eval_iter']}): one before every step that is a multiple of eval_interval, "
                              "and one at the end.")
        assert_close(np.array(history[key], dtype=np.float64), np.array(want[key], dtype=np.float64),
                     what=f"history[{key!r}]", rtol=1e-9, atol=1e-12, inputs=inputs, mistakes=mistakes,
                     hint="chapter 04's `train` (lesson 04) evaluates before the step, draws each evaluation's batches "
                          "from the same batches, train split first")
    finished = _flat(model)
    # interrupted after k steps, resumed by other objects from the checkpoint
    k = int(rng().integers(3, 6))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "run.ckpt")
        ct.manual_seed(seed)
        first = _Tiny(V, C)
        require(np.array_equal(_flat(first), start), "the check could not rebuild its model")
        short = TrainConfig(**{**cfg.__dict__, "max_iters": k})
        your_train(first, _Momentum(first.parameters(), lr=cfg.lr), Batches(tokens, T, B, seed=seed), short, LIBRARY,
                   checkpoint=path, save_every=k)
        require(os.path.exists(path), f"train(..., checkpoint=path, save_every={k}) ran {k} steps and saved nothing.")
        ct.manual_seed(seed + 7)
        second = _Tiny(V, C)
        rest = your_train(second, _Momentum(second.parameters(), lr=cfg.lr), Batches(tokens, T, B, seed=seed + 7), cfg,
                          LIBRARY, checkpoint=path, save_every=k, resume=True)
    require(list(rest["iter"]) == list(range(k, cfg.max_iters)),
            f"the run resumed from a checkpoint saved after {k} steps ran steps {list(rest['iter'])}; it goes on from "
            f"step {k} to {cfg.max_iters - 1}.")
    require(list(rest["loss"]) == list(history["loss"][k:]) and np.array_equal(_flat(second), finished),
            f"a run stopped after {k} steps and resumed from its checkpoint ends with other weights than the run that "
            "never stopped: a resumed run must go on exactly, bit for bit (the same rates, the same batches, the "
            "same optimizer state).", hint="lesson 12, section 11")
    return "8 steps with evaluations against chapter 04's train on PyTorch; stopped and resumed from a " \
           "checkpoint, equal bit for bit to the run that never stopped"


# ---- 14. sampling ---------------------------------------------------------------------------------------

class _Sampled:
    """Chapter 04's PyTorch GPT behind the library's interface: model(idx) -> (a course Tensor of logits, None).
    It notes how it is called: in eval mode, without recording a graph, at most block_size positions."""

    def __init__(self, torch_gpt):
        self.torch_gpt, self.config, self.training, self.calls = torch_gpt, torch_gpt.config, True, []
        self.one = ct.Tensor(np.ones(1), requires_grad=True, dtype=np.float64)

    def eval(self):
        self.training = False
        return self

    def train(self, mode=True):
        self.training = mode
        return self

    def __call__(self, idx, targets=None):
        idx = np.asarray(idx)
        if idx.shape[1] > self.config.block_size:
            raise ValueError(f"the model got {idx.shape[1]} positions; it reads at most block_size = "
                             f"{self.config.block_size}")
        self.calls.append((idx.copy(), self.training, ct.is_grad_enabled()))
        with torch.no_grad():
            logits = self.torch_gpt(torch.from_numpy(idx.astype(np.int64)))[0].numpy()
        return ct.Tensor(logits, dtype=np.float64) * self.one, None


class _Draw:
    """draw(probs) -> one id per row, by fixed uniforms (the same rule for yours and the oracle); notes probs."""

    def __init__(self, uniforms):
        self.uniforms, self.seen = uniforms, []

    def pick(self, probs, step):
        u = self.uniforms[step % len(self.uniforms)]
        return np.minimum((np.cumsum(probs, axis=-1) < u[:, None]).sum(-1), probs.shape[-1] - 1)

    def __call__(self, probs):
        probs = np.array(probs, dtype=np.float64)
        self.seen.append(probs)
        return self.pick(probs, len(self.seen) - 1)


@exercise
def generate(your_generate):
    """generate(model, idx, max_new_tokens, temperature, top_k, draw) -> idx with max_new_tokens ids appended,
    each drawn by draw(probabilities of the next token) as chapter 04 computes them."""
    config = GPTConfig(vocab_size=int(rng().integers(9, 20)), block_size=int(rng().integers(5, 8)), n_layer=1,
                       n_head=2, n_embd=6, dropout=0.0)
    torch.manual_seed(int(rng().integers(2**31)))
    torch_gpt = _jostled(TorchGPT(config).double()).eval()
    B, T0 = 2, 3
    n = config.block_size + 3                      # the context outgrows block_size
    for temperature, top_k in ((float(rng().uniform(0.5, 0.9)), int(rng().integers(2, 5))),
                               (float(rng().uniform(1.1, 1.6)), None), (1.0, config.vocab_size + 2)):
        model = _Sampled(torch_gpt)
        prompt = rng().integers(0, config.vocab_size, (B, T0))
        draw = _Draw(rng().random((n, B)))
        out = np.asarray(your_generate(model, prompt, n, temperature, top_k, draw))
        inputs = {"temperature": temperature, "top_k": top_k, "block_size": config.block_size, "prompt": prompt}
        require(out.shape == (B, T0 + n), f"generate returned shape {out.shape}; expected {(B, T0 + n)}: the prompt "
                "and the new ids after it.")
        require(np.array_equal(out[:, :T0], prompt), "the returned ids do not start with the prompt.")
        require(model.calls, "generate never called the model.")
        require(not any(training for _, training, _ in model.calls),
                "the model was in training mode while it sampled: a GPT with dropout would drop numbers.")
        require(not any(grad for _, _, grad in model.calls),
                "sampling recorded a graph at every step: no gradient is ever taken of it, and each step's graph "
                "keeps every activation alive until it is dropped.")
        require(len(draw.seen) == n, f"draw was called {len(draw.seen)} times for {n} new tokens: once per token, "
                "with the probabilities of every row.")
        oracle = _Draw(draw.uniforms)
        ids = prompt.copy()
        for step in range(n):
            with torch.no_grad():
                logits = torch_gpt(torch.from_numpy(ids[:, -config.block_size:]))[0][:, -1]
                probs = torch.softmax(top_k_filter(logits / temperature, top_k), dim=-1).numpy()
            assert_close(draw.seen[step], probs, what=f"the probabilities handed to draw for new token {step + 1}",
                         rtol=1e-9, atol=1e-12, inputs=inputs,
                         hint="chapter 04's sampling: the last position's logits, scaled by the temperature, all but "
                              "the top_k largest dropped, then a softmax")
            ids = np.concatenate([ids, oracle.pick(probs, step)[:, None]], axis=1)
        require(np.array_equal(out, ids), f"your tokens differ from those the same draws give: yours {fmt(out)}, "
                f"expected {fmt(ids)}: each new id is draw's pick, appended before the next step.")
    return "3 settings of temperature and top-k, 3 new tokens more than block_size: every step's probabilities " \
           "and the tokens, against chapter 04's sampling"
