"""Neural-network kernels: convolution and pooling (by sliding windows), and normalizations."""

import functools
import itertools

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..registry import Unsupported, register


def _pads(auto_pad, pads, size, kernel, strides, dilations):
    """Per-axis (begin, end) padding, for explicit pads or auto_pad SAME_UPPER / SAME_LOWER / VALID."""
    n = len(size)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for i in range(n):
            total = max((-(-size[i] // strides[i]) - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - size[i], 0)
            small = total // 2
            out.append((small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small))
        return out
    if auto_pad == "VALID" or pads is None:
        return [(0, 0)] * n
    return [(pads[i], pads[i + n]) for i in range(n)]


def _padded(x, kernel, strides, dilations, pads, fill, ceil_mode=False, extra_fill=None):
    """Pad x (N, C, *spatial) for pooling or convolution; returns the padded array and the output size.

    With ceil_mode the last window may run past the right padding: we pad a little more, with
    `extra_fill` (so an average pool can tell those cells from the explicit padding)."""
    n = len(kernel)
    size = x.shape[2:]
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    out = []
    for i in range(n):
        span = size[i] + pads[i][0] + pads[i][1] - eff[i]
        o = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
        if ceil_mode and (o - 1) * strides[i] >= size[i] + pads[i][0]:
            o -= 1  # a window may not start in the right padding
        out.append(o)
    extra = [max((o - 1) * s + e - (sz + p0 + p1), 0) for o, s, e, sz, (p0, p1) in zip(out, strides, eff, size, pads)]
    xp = x
    if any(p0 or p1 for p0, p1 in pads):  # np.pad copies even when there is nothing to add: skip it then
        xp = np.pad(xp, [(0, 0), (0, 0)] + list(pads), constant_values=fill)
    if any(extra):
        xp = np.pad(xp, [(0, 0), (0, 0)] + [(0, ex) for ex in extra],
                    constant_values=fill if extra_fill is None else extra_fill)
    return xp, out


def _shifted(xp, kernel, strides, dilations, out):
    """For each offset inside the kernel, the strided slice of xp that this offset sees in every window.

    A pool is then a max (or sum) over len(kernel) slices of the output's size, instead of a reduction
    over tiny strided windows, which numpy does slowly."""
    for offset in itertools.product(*(range(k) for k in kernel)):
        yield xp[(slice(None), slice(None)) + tuple(slice(o * d, o * d + s * (n - 1) + 1, s)
                                                    for o, d, s, n in zip(offset, dilations, strides, out))]


def _windows(x, kernel, strides, dilations, pads, fill):
    """x (N, C, *spatial) -> windows (N, C, *out, *kernel): a strided view, no copy (im2col reads it)."""
    n = len(kernel)
    xp, out = _padded(x, kernel, strides, dilations, pads, fill)
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    w = sliding_window_view(xp, eff, axis=tuple(range(2, 2 + n)))
    w = w[(Ellipsis,) + tuple(slice(None, None, d) for d in dilations)]
    return w[(slice(None), slice(None)) + tuple(slice(0, o * s, s) for o, s in zip(out, strides))], out


@register("Conv", since=1)
def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Convolution as one matrix product per group over im2col windows (sliding_window_view)."""
    n = x.ndim - 2
    kernel = list(w.shape[2:])
    strides, dilations = strides or [1] * n, dilations or [1] * n
    pads = _pads(auto_pad, pads, x.shape[2:], kernel, strides, dilations)
    win, _ = _windows(x, kernel, strides, dilations, pads, 0)      # (N, C, *out, *k), a view
    N, C, out = x.shape[0], x.shape[1], win.shape[2:2 + n]
    M, G = w.shape[0], group
    # (N, G, C/G, *out, *k) -> (N, G, prod(out), C/G * prod(k)): the im2col matrix of each group
    cols = win.reshape(N, G, C // G, *out, *kernel)
    cols = np.moveaxis(cols, 2, 2 + n).reshape(N, G, int(np.prod(out)), -1)
    wm = w.reshape(G, M // G, -1)                                   # (G, M/G, C/G * prod(k))
    if G == 1:  # the whole batch in one BLAS call: (N * prod(out), C * prod(k)) @ (C * prod(k), M)
        y = (cols.reshape(-1, cols.shape[-1]) @ wm[0].T).reshape(N, 1, -1, M)
    else:
        y = np.matmul(cols, wm.transpose(0, 2, 1))                  # (N, G, prod(out), M/G)
    y = y.transpose(0, 1, 3, 2).reshape(N, M, *out)                 # a copy, so the bias can go in place
    if b is not None:
        y += b.reshape((1, M) + (1,) * n).astype(y.dtype, copy=False)
    return y.astype(x.dtype, copy=False)


def _pool_args(x, kernel_shape, strides, dilations, pads, auto_pad):
    n = x.ndim - 2
    strides, dilations = strides or [1] * n, dilations or [1] * n
    return n, strides, dilations, _pads(auto_pad, pads, x.shape[2:], kernel_shape, strides, dilations)


@register("MaxPool", since=8)
def max_pool(x, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, dilations=None, pads=None, storage_order=0,
             strides=None, _n_outputs=1):
    if _n_outputs > 1:
        raise Unsupported("MaxPool's Indices output")
    if x.dtype.kind != "f":
        raise Unsupported(f"MaxPool on {x.dtype}")
    n, strides, dilations, pads = _pool_args(x, kernel_shape, strides, dilations, pads, auto_pad)
    xp, out = _padded(x, kernel_shape, strides, dilations, pads, -np.inf, bool(ceil_mode))
    return functools.reduce(np.maximum, _shifted(xp, kernel_shape, strides, dilations, out))


@register("AveragePool", since=7)
def average_pool(x, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 pads=None, strides=None):
    """The mean over each window; padding counts in the divisor only with count_include_pad."""
    n, strides, dilations, pads = _pool_args(x, kernel_shape, strides, dilations, pads, auto_pad)
    xp, out = _padded(x, kernel_shape, strides, dilations, pads, 0, bool(ceil_mode))
    total = functools.reduce(np.add, _shifted(xp, kernel_shape, strides, dilations, out))
    # count the cells of each window that are real input (or, with count_include_pad, explicit padding)
    ones = np.ones((1, 1) + x.shape[2:], dtype=x.dtype)
    op, _ = _padded(ones, kernel_shape, strides, dilations, pads, 1 if count_include_pad else 0, bool(ceil_mode), 0)
    count = functools.reduce(np.add, _shifted(op, kernel_shape, strides, dilations, out))
    return (total / count).astype(x.dtype)


@register("GlobalAveragePool", since=1)
def global_average_pool(x):
    return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True)


@register("GlobalMaxPool", since=1)
def global_max_pool(x):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


@register("BatchNormalization", since=15)
def batch_norm(x, scale, bias, mean, var, *, epsilon=1e-5, momentum=0.9, training_mode=0, _n_outputs=1):
    if training_mode or _n_outputs > 1:
        raise Unsupported("BatchNormalization in training mode")
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + epsilon)
    return (y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


@register("InstanceNormalization", since=6)
def instance_norm(x, scale, bias, *, epsilon=1e-5):
    axes = tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - x.mean(axis=axes, keepdims=True)) / np.sqrt(x.var(axis=axes, keepdims=True) + epsilon)
    return (y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


@register("LayerNormalization", since=17)
def layer_norm(x, scale, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1, _n_outputs=1):
    """Normalize over the axes from `axis` on, then scale and shift. Optional outputs: mean, 1/std."""
    axes = tuple(range(axis % x.ndim, x.ndim))
    xf = x.astype(np.float32, copy=False) if stash_type == 1 and x.dtype != np.float64 else x
    mean = xf.mean(axis=axes, keepdims=True)
    y = xf - mean                                  # a fresh buffer: the rest works in place
    inv_std = np.mean(np.square(y), axis=axes, keepdims=True)
    inv_std += epsilon
    inv_std = 1 / np.sqrt(inv_std)
    y *= inv_std
    y *= scale
    if bias is not None:
        y += bias
    return (y.astype(x.dtype, copy=False), mean, inv_std)[:_n_outputs]


@register("LpNormalization", since=1)
def lp_norm(x, *, axis=-1, p=2):
    norm = np.abs(x).sum(axis=axis, keepdims=True) if p == 1 else np.sqrt((x * x).sum(axis=axis, keepdims=True))
    return np.where(norm == 0, 0, x / np.where(norm == 0, 1, norm)).astype(x.dtype)


@register("MeanVarianceNormalization", since=13)
def mvn(x, *, axes=(0, 2, 3)):
    axes = tuple(axes)
    return ((x - x.mean(axis=axes, keepdims=True)) / (np.sqrt(x.var(axis=axes, keepdims=True)) + 1e-9)).astype(x.dtype)


@register("LRN", since=13)
def lrn(x, *, size, alpha=1e-4, beta=0.75, bias=1.0):
    c = x.shape[1]
    sq = np.pad(x * x, [(0, 0), ((size - 1) // 2, size - 1 - (size - 1) // 2)] + [(0, 0)] * (x.ndim - 2))
    s = sum(sq[:, i:i + c] for i in range(size))
    return (x / (bias + alpha / size * s) ** beta).astype(x.dtype)
