"""Matrix products and normalized exponentials: MatMul, Gemm, Einsum, Softmax and friends, CumSum, ArgMax."""

import numpy as np

from ..registry import Unsupported, register


@register("MatMul", since=1)
def matmul(a, b):
    return np.matmul(a, b)


@register("Gemm", since=7)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    """The course's answer to exercise 09.2 (`gemm`): read it once your check passes.

    Y = alpha * A' @ B' + beta * C, where X' is X transposed when transX is set; C broadcasts."""
    a = a.T if transA else a
    b = b.T if transB else b
    y = a @ b                  # a fresh buffer: the scaling and the bias go in place
    if alpha != 1.0:
        y *= y.dtype.type(alpha)
    if c is not None:
        try:
            y += c if beta == 1.0 else c * c.dtype.type(beta)
        except ValueError:
            raise ValueError(f"Gemm's C of shape {c.shape} does not broadcast to the product's shape {y.shape}") from None
    return y.astype(a.dtype, copy=False)


@register("Einsum", since=12)
def einsum(*xs, equation):
    return np.einsum(equation.replace(" ", ""), *xs)


def _exp_normalize(e, axis):
    """The course's answer to exercise 09.3 (`softmax`): read it once your check passes.

    exp(e) / sum(exp(e)) along `axis`, in place in e."""
    np.exp(e, out=e)
    e /= e.sum(axis=axis, keepdims=True)
    return e


def softmax_in_place(y, axis):
    """Softmax of y along `axis`, written over y (a buffer of our own); subtracting the max avoids overflow."""
    y -= y.max(axis=axis, keepdims=True)
    return _exp_normalize(y, axis)


def _softmax(x, axis):
    """The course's answer to exercise 09.3 (`softmax`): read it once your check passes."""
    return _exp_normalize(x - x.max(axis=axis, keepdims=True), axis)  # x - max is a fresh buffer


def _coerced(fn):
    """Opsets before 13 flatten x to 2-D at `axis` and normalize each row."""
    def kernel(x, *, axis=1):
        axis = axis % max(x.ndim, 1)
        flat = x.reshape(int(np.prod(x.shape[:axis])), -1)
        return fn(flat, axis=1).reshape(x.shape)
    return kernel


@register("Softmax", since=13)
def softmax(x, *, axis=-1):
    """The course's answer to exercise 09.3 (`softmax`): read it once your check passes.

    exp(x - max) / sum(exp(x - max)) along `axis`; subtracting the max avoids overflow."""
    return _softmax(x, axis)


@register("LogSoftmax", since=13)
def log_softmax(x, *, axis=-1):
    s = x - x.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


@register("Hardmax", since=13)
def hardmax(x, *, axis=-1):
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    y = np.zeros_like(x)
    np.put_along_axis(y, idx, 1, axis=axis)
    return y


register("Softmax", since=1)(_coerced(lambda x, axis: softmax(x, axis=axis)))
register("LogSoftmax", since=1)(_coerced(lambda x, axis: log_softmax(x, axis=axis)))
register("Hardmax", since=1)(_coerced(lambda x, axis: hardmax(x, axis=axis)))


def _cumulative(ufunc, x, axis, exclusive, reverse):
    """ufunc accumulated along `axis`; exclusive shifts by one (starting from the identity), reverse
    accumulates from the end."""
    axis = int(np.asarray(axis).reshape(-1)[0])
    if reverse:
        x = np.flip(x, axis)
    y = ufunc.accumulate(x, axis=axis, dtype=x.dtype)
    if exclusive:
        first = np.full_like(np.take(y, [0], axis=axis), ufunc.identity)
        y = np.concatenate([first, np.take(y, range(y.shape[axis] - 1), axis=axis)], axis)
    return np.flip(y, axis) if reverse else y


@register("CumSum", since=11)
def cumsum(x, axis, *, exclusive=0, reverse=0):
    return _cumulative(np.add, x, axis, exclusive, reverse)


@register("CumProd", since=26)
def cumprod(x, axis, *, exclusive=0, reverse=0):
    return _cumulative(np.multiply, x, axis, exclusive, reverse)


def _arg(fn):
    def kernel(x, *, axis=0, keepdims=1, select_last_index=0):
        if select_last_index:
            flipped = np.flip(x, axis)
            i = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            i = fn(x, axis=axis)
        i = i.astype(np.int64)
        return np.expand_dims(i, axis) if keepdims else i
    return kernel


register("ArgMax", since=11)(_arg(np.argmax))
register("ArgMin", since=11)(_arg(np.argmin))


@register("TopK", since=11)
def topk(x, k, *, axis=-1, largest=1, sorted=1):
    k = int(np.asarray(k).reshape(-1)[0])
    if not sorted:
        raise Unsupported("TopK with sorted=0")
    # among equal values the lower index comes first, as ONNX asks: a stable sort does that
    if largest:  # sort the flipped array ascending, then reverse: ties stay in index order
        n = x.shape[axis]
        order = n - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    idx = np.take(order, range(k), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


@register("Det", since=11)
def det(x):
    return np.linalg.det(x).astype(x.dtype)
