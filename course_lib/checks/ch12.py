"""Checks for chapter 12, the capstone: the fused Functions a GPT needs (softmax, GPT-2's GELU, layer norm,
the embedding lookup, masked fill), each forward and backward, and the causal self-attention of one block,
all written on course_lib.tensor. Each is compared in float64 with PyTorch's autograd on random shapes.

A fused op must also keep its promise: it is ONE node of the graph (its forward records nothing) and it
saves for its backward only what the backward needs. The checks count the numbers a Function keeps on
its context and name what is too much.
"""

import math

import numpy as np
import torch
import torch.nn.functional as F

import course_lib.tensor as ct
from course_lib.checks import CheckFailed, assert_close, exercise, fmt, require, rng
from course_lib.gpt.model import CausalSelfAttention as TorchAttention
from course_lib.gpt.model import GPTConfig
from course_lib.tensor import nn
from course_lib.tensor.tensor_data import TensorData


def _array(x, what):
    """Your result as a float64 numpy array: a course Tensor, a numpy array or a torch tensor."""
    if x is None:
        raise CheckFailed(f"{what}: your code returned None. Did you forget a `return`?")
    if isinstance(x, ct.Tensor):
        return x.numpy().astype(np.float64)
    if isinstance(x, TensorData):
        return np.array(x.to_numpy(), dtype=np.float64)
    if isinstance(x, torch.Tensor):
        return x.detach().numpy().astype(np.float64)
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise CheckFailed(f"{what}: expected a Tensor or an array, got {type(x).__name__}: {fmt(x)}") from None


def _t(a):
    return torch.tensor(a, dtype=torch.float64, requires_grad=True)


def _ours(a, grad=True):
    return ct.Tensor(np.asarray(a, dtype=np.float64), requires_grad=grad, dtype=np.float64)


def _is_function(cls, name):
    require(isinstance(cls, type) and issubclass(cls, ct.Function),
            f"`{name}` should be a class derived from the library's Function, got {type(cls).__name__}.",
            hint="class Name(Function): with a @staticmethod forward(ctx, ...) and a @staticmethod backward(ctx, grad)")


def _forward(cls, name, *inputs, **kwargs):
    """Apply your Function; the output as a Tensor, and the context it filled."""
    out = cls.apply(*inputs, **kwargs)
    require(isinstance(out, ct.Tensor), f"{name}.apply returned {type(out).__name__}.",
            hint="forward returns the raw data of the result: a TensorData (t.data of a Tensor t).")
    return out, out._ctx


def _gradients(out, upstream, *inputs):
    """Backpropagate `upstream` from out; the gradient reaching each input (None where none did)."""
    for x in inputs:
        x.grad = None
    out.backward(ct.Tensor(upstream, dtype=np.float64))
    return [None if x.grad is None else x.grad.numpy() for x in inputs]


def _storages(value, found):
    """Every array kept by `value` (a context's attribute): {id of its memory: numbers kept in it}."""
    if isinstance(value, ct.Tensor):
        value = value.data
    if isinstance(value, TensorData):
        found[id(value.storage)] = max(found.get(id(value.storage), 0), value.size)
    elif isinstance(value, np.ndarray) and value.dtype.kind == "f":
        base = value.base if value.base is not None else value
        found[id(base)] = max(found.get(id(base), 0), value.size)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _storages(v, found)
    elif isinstance(value, dict):
        for v in value.values():
            _storages(v, found)


def _kept(ctx, parameters=()):
    """How many numbers (floats) the context keeps alive for the backward, parameters not counted
    (a Module holds those anyway)."""
    found = {}
    for value in vars(ctx).values():
        _storages(value, found)
    for p in parameters:
        found.pop(id(p.data.storage), None)
    return sum(found.values())


def _recorded(ctx):
    """The first tensor on the context that carries a graph (the forward ran with autograd on), or None."""
    values = []
    for value in vars(ctx).values():
        values.extend(value if isinstance(value, (tuple, list)) else [value])
    return next((v for v in values if isinstance(v, ct.Tensor) and v._fn is not None), None)


def _one_node(ctx, name):
    t = _recorded(ctx)
    require(t is None, f"your {name}'s context keeps a tensor with a graph of its own (made by "
            f"{t._fn.__name__ if t is not None else ''}): the forward ran with autograd on, so every step "
            f"inside it was recorded, and kept alive, as its own node.",
            hint="do the forward's work inside `with no_grad():` (or on a.detach()): the Function is the one node.")


def _lean(ctx, name, budget, what, parameters=()):
    kept = _kept(ctx, parameters)
    require(kept <= budget, f"your {name} keeps {kept:,} numbers on its context for the backward; {what} "
            f"({budget:,} numbers) are all it needs.",
            hint="a fused op saves only what its backward multiplies by: keep those on ctx, drop the rest "
                 "(the input, intermediate steps).")


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
                     mistakes={f"that is the softmax over another dim: use the dim you are given ({dim})":
                               other_dim,
                               "exp overflowed: subtract each row's max before exp (softmax does not change)":
                               unshifted})
        _one_node(ctx, "Softmax")
        _lean(ctx, "Softmax", a.size, "its output's", parameters=())
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
                     mistakes={"that is log-softmax's backward, grad - s * sum(grad); softmax's has the sum of "
                               "grad * s inside, and s outside": log_softmax_rule,
                               "the sum inside must weigh the gradient by s: sum(grad * s) over the dim": no_inner})
    return "4 inputs (another dim than the last, logits of +-1000, masked rows with -inf), one node, its output kept"


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
                     mistakes={"that is the exact GELU, a * Phi(a) (torch's default); GPT-2's is the tanh form "
                               "0.5 a (1 + tanh(c (a + k a^3)))": exact,
                               "the cubic term is missing: u = c (a + 0.044715 a^3)": 0.5 * a * (1 + np.tanh(_C * a)),
                               "the factor 0.5 is missing": a * (1 + t)})
        _one_node(ctx, "GELU")
        _lean(ctx, "GELU", 2 * a.size, "the input and one more array of its size")
        upstream = rng().normal(size=a.shape)
        (mine,) = _gradients(out, upstream, x)
        want.backward(torch.from_numpy(upstream))
        require(mine is not None, "no gradient reached the input: does backward return it?")
        du = _C * (1 + 3 * _K * a**2)
        assert_close(mine, tx.grad.numpy(), what=f"the gradient of GELU's input ({a.shape})", rtol=1e-9, atol=1e-12,
                     inputs={"a": a, "grad": upstream},
                     mistakes={"only 0.5 (1 + t): a also multiplies tanh(u), so the product rule adds "
                               "0.5 a (1 - t^2) du/da": upstream * 0.5 * (1 + t),
                               "du/da is c (1 + 3 k a^2); the 3 k a^2 of the cubic is missing":
                               upstream * (0.5 * (1 + t) + 0.5 * a * (1 - t * t) * _C),
                               "tanh's derivative is 1 - t^2, not 1 - t": upstream * (0.5 * (1 + t) + 0.5 * a * (1 - t) * du),
                               "the upstream gradient is missing: multiply by grad": 0.5 * (1 + t) + 0.5 * a * (1 - t * t) * du})
    return "fixed values (0, +-1, +-5, +-30) and random ones, against torch's gelu(approximate='tanh'); one node"


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
                               "eps belongs inside the square root: 1 / sqrt(var + eps)":
                               (a - a.mean(-1, keepdims=True)) / (np.sqrt(var) + eps) * weight + bias,
                               "eps is not the one given: use the eps argument": (
                                   (a - a.mean(-1, keepdims=True)) / np.sqrt(var + 1e-5) * weight + bias),
                               "the bias is missing": xhat * weight,
                               "the gain is missing": xhat + bias})
        _one_node(ctx, "LayerNorm")
        rows = a.size // n
        _lean(ctx, "LayerNorm", a.size + 2 * rows + 2 * n, "xhat (the input's size) and one or two numbers per row",
              parameters=(w, b))
        d_a, d_w, d_b = _gradients(out, upstream, x, w, b)
        want.backward(torch.from_numpy(upstream))
        inputs = {"a": a, "grad": upstream, "weight": weight}
        for mine, name in ((d_a, "d_a"), (d_w, "d_weight"), (d_b, "d_bias")):
            require(mine is not None, f"no gradient reached {name[2:]}: backward returns (d_a, d_weight, d_bias).")
        assert_close(d_a, ta.grad.numpy(), what=f"d_a for an input of shape {shape}", rtol=1e-7, atol=1e-9,
                     inputs=inputs, mistakes=_layer_norm_mistakes(upstream, xhat, r, weight))
        flat, x_flat = upstream.reshape(-1, n), xhat.reshape(-1, n)
        assert_close(d_w, tw.grad.numpy(), what=f"d_weight for an input of shape {shape}", rtol=1e-7, atol=1e-9,
                     inputs=inputs, hint="the gain multiplies xhat, so its gradient adds up grad * xhat over every "
                                         "row (every dim but the last)",
                     mistakes={"that is the sum of grad alone; the gain's gradient is the sum of grad * xhat":
                               flat.sum(0)})
        assert_close(d_b, tb.grad.numpy(), what=f"d_bias for an input of shape {shape}", rtol=1e-7, atol=1e-9,
                     inputs=inputs, hint="the bias is added to every row, so its gradient adds up grad over every row",
                     mistakes={"that is the sum of grad * xhat, the gain's gradient; the bias gets the sum of grad":
                               (flat * x_flat).sum(0)})
    return "a 2-D and a 3-D input, two eps, against PyTorch's layer_norm; one node keeping xhat and r"


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
        _one_node(ctx, "Embedding")
        _lean(ctx, "Embedding", 0, "the indices (and the table's size)", parameters=(w,))
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
                               "indices, `out[idx] += g` and `out[idx] = g` write each row once (numpy does not "
                               "add up the repeats)": last_wins,
                               "that is the mean over the positions of each row; the gradient is their sum":
                               tw.grad.numpy() / counts},
                     hint="row i of the gradient is the sum of the grad rows of every position whose index is i")
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
                     mistakes={"a * (1 - mask) + value * mask gives nan where the mask is 0 and value is -inf "
                               "(-inf * 0): pick with the library's where instead of arithmetic": arithmetic,
                               "the mask is the wrong way round: value goes where the mask is 1":
                               np.where(mask != 0, a, value)})
        require(np.isfinite(out.numpy()[np.broadcast_to(mask, shape) == 0]).all(),
                "where the mask is 0 your output is not a's number.")
        _one_node(ctx, "MaskedFill")
        _lean(ctx, "MaskedFill", mask.size, "the mask's")
        (mine,) = _gradients(out, upstream, x)
        want.backward(torch.from_numpy(upstream))
        require(mine is not None, "no gradient reached a: backward returns (d_a, None).")
        assert_close(mine, tx.grad.numpy(), what=f"the gradient of a ({shape}, mask {mask.shape})", rtol=0, atol=0,
                     inputs={"mask": mask, "grad": upstream},
                     mistakes={"the filled places got the gradient too: they are the constant value, not a's "
                               "numbers, so a gets 0 there": upstream,
                               "the gradient is zeroed where the mask is 0 and kept where it is 1: the other way "
                               "round": np.where(np.broadcast_to(mask, shape) != 0, upstream, 0.0)})
    return "the causal mask with -inf on 4-D scores, a finite value under another broadcast mask; the mask kept"


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
