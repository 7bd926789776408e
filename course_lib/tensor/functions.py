"""Every op as a Function: the forward value and, right beside it, its derivative rule.

Some of these are the course's answers to chapter 02's exercises (Mul, Sum, reduce_dims, MatMul,
LogSoftmax and CrossEntropy), each marked with the exercise it answers: read one once your check passes.

forward(ctx, ...) works on raw data through the current backend and returns a
TensorData. backward(ctx, grad) returns one gradient per tensor input, written with
ordinary tensor ops (autograd is off while it runs).
"""

from __future__ import annotations

import numpy as np

from course_lib.tensor.autodiff import Function, unbroadcast
from course_lib.tensor.backend import current_backend
from course_lib.tensor.broadcast import shape_broadcast
from course_lib.tensor.tensor_data import ShapeError, TensorData, slice_view

# ------------------------------------------------------------ raw helpers

def map_(op, a):
    return current_backend().map(op, a.data)


def zip_(op, a, b):
    if a.shape != b.shape:
        shape_broadcast(a.shape, b.shape, op)  # a clear error before any backend runs
    return current_backend().zip(op, a.data, b.data)


# ------------------------------------------------------------ elementwise, binary

class Add(Function):
    """a + b;  d/da = 1, d/db = 1."""
    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = (a.shape, b.shape)
        return zip_("add", a, b)

    @staticmethod
    def backward(ctx, grad):
        return unbroadcast(grad, ctx.shapes[0]), unbroadcast(grad, ctx.shapes[1])


class Sub(Function):
    """a - b;  d/da = 1, d/db = -1."""
    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = (a.shape, b.shape)
        return zip_("sub", a, b)

    @staticmethod
    def backward(ctx, grad):
        return unbroadcast(grad, ctx.shapes[0]), unbroadcast(-grad, ctx.shapes[1])


class Mul(Function):
    """The course's answer to exercise 02.4 (`mul_function`): read it once your check passes.

    a * b;  d/da = b, d/db = a."""
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return zip_("mul", a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        ga = unbroadcast(grad * b, a.shape) if ctx.needs_grad[0] else None
        gb = unbroadcast(grad * a, b.shape) if ctx.needs_grad[1] else None
        return ga, gb


class Div(Function):
    """a / b;  d/da = 1/b, d/db = -a/b^2."""
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return zip_("div", a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        ga = unbroadcast(grad / b, a.shape) if ctx.needs_grad[0] else None
        gb = unbroadcast(-grad * a / (b * b), b.shape) if ctx.needs_grad[1] else None
        return ga, gb


class Pow(Function):
    """a ** b;  d/da = b * a^(b-1), d/db = a^b * log(a)."""
    @staticmethod
    def forward(ctx, a, b):
        out = zip_("pow", a, b)
        ctx.save_for_backward(a, b)
        ctx.out = out
        return out

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        ga = unbroadcast(grad * b * a ** (b - 1.0), a.shape) if ctx.needs_grad[0] else None
        gb = unbroadcast(grad * grad._new(ctx.out) * a.log(), b.shape) if ctx.needs_grad[1] else None
        return ga, gb


class Maximum(Function):
    """max(a, b) elementwise; the gradient goes to the larger one (half each on a tie)."""
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return zip_("max", a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        a_wins = (a > b) + (a == b) * 0.5
        return unbroadcast(grad * a_wins, a.shape), unbroadcast(grad * (1.0 - a_wins), b.shape)


# ------------------------------------------------------------ elementwise, unary

class Neg(Function):
    """-a;  d/da = -1."""
    @staticmethod
    def forward(ctx, a):
        return map_("neg", a)

    @staticmethod
    def backward(ctx, grad):
        return -grad


class Exp(Function):
    """exp(a);  d/da = exp(a), the output itself."""
    @staticmethod
    def forward(ctx, a):
        ctx.out = map_("exp", a)
        return ctx.out

    @staticmethod
    def backward(ctx, grad):
        return grad * grad._new(ctx.out)


class Log(Function):
    """log(a);  d/da = 1/a."""
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return map_("log", a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad / a


class Sqrt(Function):
    """sqrt(a);  d/da = 1 / (2 sqrt(a))."""
    @staticmethod
    def forward(ctx, a):
        ctx.out = map_("sqrt", a)
        return ctx.out

    @staticmethod
    def backward(ctx, grad):
        return grad / (grad._new(ctx.out) * 2.0)


class ReLU(Function):
    """max(a, 0);  d/da = 1 where a > 0, else 0."""
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return map_("relu", a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad * grad._new(map_("step", a))


class Sigmoid(Function):
    """s = 1 / (1 + exp(-a));  d/da = s (1 - s)."""
    @staticmethod
    def forward(ctx, a):
        ctx.out = map_("sigmoid", a)
        return ctx.out

    @staticmethod
    def backward(ctx, grad):
        s = grad._new(ctx.out)
        return grad * s * (1.0 - s)


class Tanh(Function):
    """t = tanh(a);  d/da = 1 - t^2."""
    @staticmethod
    def forward(ctx, a):
        ctx.out = map_("tanh", a)
        return ctx.out

    @staticmethod
    def backward(ctx, grad):
        t = grad._new(ctx.out)
        return grad * (1.0 - t * t)


class GELU(Function):
    """a * Phi(a) (Phi: the normal CDF);  d/da = Phi(a) + a * phi(a)."""
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return map_("gelu", a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad * grad._new(map_("gelu_grad", a))


# ------------------------------------------------------------ a GPT's ops, composed
# The ops below are no Functions of their own: each applies a few of the ops above, and autograd records
# every step. That is all a small model needs. Chapter 12 writes each as ONE fused Function with its
# backward worked out by hand, and puts it in through the op registry (registry.py, `use_ops`).

class Composed:
    """An op of the registry computed by recorded ops of the library: `apply` has a Function's signature."""

    @staticmethod
    def apply(*inputs, **kwargs):
        raise NotImplementedError


class GELUTanh(Composed):
    """GPT-2's GELU, 0.5 a (1 + tanh(c (a + k a^3))), as a * sigmoid(2 c (a + k a^3)): the same function
    (0.5 (1 + tanh u) = sigmoid(2u)), without the cancellation in 1 + tanh(u) for very negative a."""
    C, K = float(np.sqrt(2.0 / np.pi)), 0.044715

    @staticmethod
    def apply(a):
        c, k = GELUTanh.C, GELUTanh.K
        return a * (a * (2 * c) * (1.0 + a * a * k)).sigmoid()


class LayerNorm(Composed):
    """(a - mean) / sqrt(var + eps) * weight + bias over the last dim, step by step."""

    @staticmethod
    def apply(a, weight, bias, eps):
        mean = a.mean(-1, keepdim=True)
        spread = ((a - mean) ** 2.0).mean(-1, keepdim=True)
        return (a - mean) / (spread + eps).sqrt() * weight + bias


class Embedding(Composed):
    """Row lookup, out[..., :] = weight[idx[...], :], as one_hot(idx) @ weight: a matrix of zeros with one 1
    per position. Its product's backward adds up the gradient of every position that looked row i up."""

    @staticmethod
    def apply(weight, idx):
        idx = np.asarray(idx, dtype=np.int64)
        rows = np.zeros(idx.shape + weight.shape[:1], dtype=weight.dtype)
        np.put_along_axis(rows, idx[..., None], 1.0, axis=-1)
        return weight._new(TensorData.from_numpy(rows, weight.dtype)) @ weight


class MaskedFill(Composed):
    """a, with `value` wherever mask (1.0/0.0, broadcast to a) is 1: the library's Where picks."""

    @staticmethod
    def apply(a, mask, value):
        if shape_broadcast(mask.shape, a.shape, "masked_fill") != a.shape:
            raise ShapeError(f"masked_fill: mask of shape {mask.shape} does not broadcast to {a.shape}")
        return Where.apply(mask, a._lift(value), a)


class Where(Function):
    """cond ? a : b;  the gradient flows to the side that was picked."""
    @staticmethod
    def forward(ctx, cond, a, b):
        shape = shape_broadcast(shape_broadcast(cond.shape, a.shape, "where"), b.shape, "where")
        ctx.cond, ctx.shapes = cond, (a.shape, b.shape, shape)
        return current_backend().where(cond.data, a.data, b.data)

    @staticmethod
    def backward(ctx, grad):
        sa, sb, _ = ctx.shapes
        zero = grad._new(TensorData.from_numpy(0.0, grad.dtype))
        return (None, unbroadcast(grad.where(ctx.cond, zero), sa),
                unbroadcast(zero.where(ctx.cond, grad), sb))


# ------------------------------------------------------------ reductions

class Sum(Function):
    """The course's answer to exercise 02.5 (`sum_function`): read it once your check passes.

    Sum over `dim` (keepdim);  d/da = 1 for every summed element: expand grad back."""
    @staticmethod
    def forward(ctx, a, dim):
        ctx.shape = a.shape
        return current_backend().reduce("sum", a.data, dim)

    @staticmethod
    def backward(ctx, grad):
        return grad.expand(ctx.shape)


def reduce_dims(fn, a, dims, keepdim):
    """The course's answer to exercise 02.6 (`tensor_methods`): read it once your check passes.

    The reduction `fn` (Sum, Max) of `a` over several dims, one dim at a time (each keeps its dim with
    size 1), the reduced dims then dropped unless keepdim."""
    out = a
    for d in dims:
        out = fn.apply(out, dim=d)
    if not keepdim:
        out = out.reshape(tuple(n for i, n in enumerate(a.shape) if i not in dims))
    return out


class Max(Function):
    """Max over `dim` (keepdim);  the gradient goes to the maximum (shared on ties)."""
    @staticmethod
    def forward(ctx, a, dim):
        ctx.save_for_backward(a)
        ctx.dim = dim
        ctx.out = current_backend().reduce("max", a.data, dim)
        return ctx.out

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        is_max = a == grad._new(ctx.out)
        return grad * is_max / is_max.sum(ctx.dim, keepdim=True)


# ------------------------------------------------------------ softmax

class LogSoftmax(Function):
    """The course's answer to exercise 02.8 (`softmax_cross_entropy`): read it once your check passes.

    a - max - log(sum(exp(a - max)));  d/da = grad - softmax * sum(grad)."""
    @staticmethod
    def forward(ctx, a, dim):
        b = current_backend()
        shifted = b.zip("sub", a.data, b.reduce("max", a.data, dim))  # exp never overflows
        lse = b.map("log", b.reduce("sum", b.map("exp", shifted), dim))
        ctx.out, ctx.dim = b.zip("sub", shifted, lse), dim
        return ctx.out

    @staticmethod
    def backward(ctx, grad):
        softmax = grad._new(ctx.out).exp()
        return grad - softmax * grad.sum(ctx.dim, keepdim=True)


class Softmax(Composed):
    """exp(log_softmax(a)) over dim: two recorded ops (the loss's LogSoftmax above, then Exp)."""

    @staticmethod
    def apply(a, dim):
        return LogSoftmax.apply(a, dim=dim).exp()


# ------------------------------------------------------------ matmul

class MatMul(Function):
    """The course's answer to exercise 02.7 (`matmul_backward`): read it once your check passes.

    a @ b for (..., n, k) @ (..., k, m);  d/da = grad @ b^T, d/db = a^T @ grad."""
    @staticmethod
    def forward(ctx, a, b):
        if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
            raise ShapeError(
                f"matmul: shapes {a.shape} and {b.shape} do not match "
                f"(a's last dim must equal b's second-to-last dim)")
        shape_broadcast(a.shape[:-2], b.shape[:-2], "matmul (batch dims)")
        ctx.save_for_backward(a, b)
        return current_backend().matmul(a.data, b.data)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        ga = unbroadcast(_product(grad, b.transpose(-1, -2), a), a.shape) if ctx.needs_grad[0] else None
        gb = unbroadcast(_product(a.transpose(-1, -2), grad, b), b.shape) if ctx.needs_grad[1] else None
        return ga, gb


def _product(x, y, like):
    """x @ y, laid out like the input `like` it is the gradient of.

    A Linear layer multiplies by W.T, a transposed view of its weight. W's gradient arrives through
    that view: were it computed as a row-major x @ y, transposing it back to W's shape would leave
    it column-major, and accumulating it would copy it. (y^T @ x^T)^T is the same matrix at the
    same cost, column-major from the start, so its transpose back to W is row-major."""
    if x.ndim == y.ndim == 2 and like.data.strides == (1, like.shape[0]):
        return (y.transpose(0, 1) @ x.transpose(0, 1)).transpose(0, 1)
    return x @ y


# ------------------------------------------------------------ shape ops (views where possible)

class Permute(Function):
    """Reorder dims (a view);  backward: permute back with the inverse order."""
    @staticmethod
    def forward(ctx, a, order):
        ctx.order = order
        return a.data.permute(*order)

    @staticmethod
    def backward(ctx, grad):
        return grad.permute(*np.argsort(ctx.order).tolist())


class Reshape(Function):
    """Same numbers, new shape (a view if contiguous);  backward: reshape back."""
    @staticmethod
    def forward(ctx, a, shape):
        ctx.shape = a.shape
        data = a.data if a.data.is_contiguous() else current_backend().map("id", a.data)
        return data.view(shape)

    @staticmethod
    def backward(ctx, grad):
        return grad.reshape(ctx.shape)


class Expand(Function):
    """Broadcast to a bigger shape (stride 0, a view);  backward: sum back."""
    @staticmethod
    def forward(ctx, a, shape):
        ctx.shape = a.shape
        return a.data.expand(shape)

    @staticmethod
    def backward(ctx, grad):
        return unbroadcast(grad, ctx.shape)


class GetItem(Function):
    """Basic slicing (a view);  backward: scatter grad into zeros at the same place."""
    @staticmethod
    def forward(ctx, a, key):
        ctx.shape, ctx.key = a.shape, key
        return slice_view(a.data, key)

    @staticmethod
    def backward(ctx, grad):
        full = TensorData.zeros(ctx.shape, grad.dtype)
        current_backend().map("id", grad.data, out=slice_view(full, ctx.key))
        return grad._new(full)


class Cat(Function):
    """Join along `dim`;  backward: each input gets its slice of grad."""
    @staticmethod
    def forward(ctx, *tensors, dim):
        first = tensors[0].shape
        for t in tensors[1:]:
            if t.ndim != len(first) or any(x != y for i, (x, y) in enumerate(zip(t.shape, first)) if i != dim):
                raise ShapeError(f"cat: shapes {[t.shape for t in tensors]} differ outside dim {dim}")
        shape = list(first)
        shape[dim] = sum(t.shape[dim] for t in tensors)
        dtype = np.result_type(*[t.dtype for t in tensors])
        out, start = TensorData.zeros(shape, dtype), 0
        ctx.pieces, ctx.dim = [], dim
        for t in tensors:
            key = (slice(None),) * dim + (slice(start, start + t.shape[dim]),)
            current_backend().map("id", t.data, out=slice_view(out, key))
            ctx.pieces.append(key)
            start += t.shape[dim]
        return out

    @staticmethod
    def backward(ctx, grad):
        return tuple(grad[key] for key in ctx.pieces)


class CrossEntropy(Function):
    """The course's answer to exercise 02.8 (`softmax_cross_entropy`): read it once your check passes.

    mean_i -log_softmax(a)[i, target_i], fused;  d/da = (softmax(a) - one_hot) / batch."""
    @staticmethod
    def forward(ctx, a, one_hot):
        b = current_backend()
        log_p = LogSoftmax.forward(ctx, a, dim=1)
        picked = b.reduce("sum", b.reduce("sum", b.zip("mul", log_p, one_hot.data), 1), 0)
        ctx.one_hot, ctx.n = one_hot, a.shape[0]
        return b.zip("div", b.map("neg", picked), TensorData.from_numpy(float(a.shape[0]), a.dtype)).view(())

    @staticmethod
    def backward(ctx, grad):
        softmax = grad._new(ctx.out).exp()
        return (softmax - ctx.one_hot) * (grad / float(ctx.n)), None
