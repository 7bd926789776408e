"""Neural-network kernels: padding rules, pooling (by shifted slices) and normalizations.

Convolution, which pads by the same rules, is in conv.py."""

import functools

import numpy as np

from ..registry import Unsupported, register


def pads_for(auto_pad, pads, size, kernel, strides, dilations):
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


@functools.lru_cache(maxsize=256)
def _pool_geometry(size, kernel, strides, dilations, pads, auto_pad, ceil_mode):
    """(pads, extra, steps) of a pool over a (N, C, *size) input, worked out once per shape.

    pads: (begin, end) per axis; extra: padding to add at the end of each axis beyond `pads` (ceil_mode
    lets the last window run past the right padding). steps: one list per spatial axis, holding for each
    offset inside the kernel the strided slice along that axis that the offset sees in every window.
    A max (or a sum) over a box is a max over one axis of the max over the other, so a k x k pool is
    k - 1 ufunc calls per axis on whole arrays, instead of a reduction over tiny strided windows,
    which numpy does slowly."""
    strides, dilations = strides or (1,) * len(size), dilations or (1,) * len(size)
    pads = tuple(tuple(p) for p in pads_for(auto_pad, pads, size, kernel, strides, dilations))
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    out = []
    for i in range(len(kernel)):
        span = size[i] + pads[i][0] + pads[i][1] - eff[i]
        o = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
        if ceil_mode and (o - 1) * strides[i] >= size[i] + pads[i][0]:
            o -= 1  # a window may not start in the right padding
        out.append(o)
    extra = tuple(max((o - 1) * s + e - (sz + p0 + p1), 0)
                  for o, s, e, sz, (p0, p1) in zip(out, strides, eff, size, pads))
    steps = []
    for axis, (k, d, s, o) in enumerate(zip(kernel, dilations, strides, out)):
        before = (slice(None),) * (2 + axis)
        steps.append([before + (slice(a * d, a * d + s * (o - 1) + 1, s),) for a in range(k)])
    return pads, extra, steps


def _padded(x, geometry, fill, extra_fill=None):
    """x (N, C, *spatial) padded as `geometry` says. The cells added for ceil_mode get `extra_fill`
    (so an average pool can tell them from the explicit padding)."""
    pads, extra, _ = geometry
    if any(p0 or p1 for p0, p1 in pads):  # np.pad copies even when there is nothing to add: skip it then
        x = np.pad(x, [(0, 0), (0, 0)] + list(pads), constant_values=fill)
    if any(extra):
        x = np.pad(x, [(0, 0), (0, 0)] + [(0, ex) for ex in extra],
                   constant_values=fill if extra_fill is None else extra_fill)
    return x


def _pool(ufunc, xp, steps):
    """ufunc over each window: axis by axis, each axis's slices folded into the first result's buffer."""
    y = xp
    for slices in steps:
        first = ufunc(y[slices[0]], y[slices[1]]) if len(slices) > 1 else y[slices[0]].copy()
        for s in slices[2:]:
            ufunc(first, y[s], out=first)
        y = first
    return y


def _geometry(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    t = lambda v: None if v is None else tuple(v)  # noqa: E731  (lists are not hashable)
    return _pool_geometry(x.shape[2:], tuple(kernel_shape), t(strides), t(dilations), t(pads), auto_pad,
                          bool(ceil_mode))


@register("MaxPool", since=8)
def max_pool(x, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, dilations=None, pads=None, storage_order=0,
             strides=None, _n_outputs=1):
    if _n_outputs > 1:
        raise Unsupported("MaxPool's Indices output")
    if x.dtype.kind != "f":
        raise Unsupported(f"MaxPool on {x.dtype}")
    geometry = _geometry(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    return _pool(np.maximum, _padded(x, geometry, -np.inf), geometry[2])


@register("AveragePool", since=7)
def average_pool(x, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 pads=None, strides=None):
    """The mean over each window; padding counts in the divisor only with count_include_pad."""
    geometry = _geometry(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    total = _pool(np.add, _padded(x, geometry, 0), geometry[2])
    # count the cells of each window that are real input (or, with count_include_pad, explicit padding)
    ones = np.ones((1, 1) + x.shape[2:], dtype=x.dtype)
    count = _pool(np.add, _padded(ones, geometry, 1 if count_include_pad else 0, 0), geometry[2])
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


@register("RMSNormalization", since=23)
def rms_norm(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """x / sqrt(mean(x^2) + epsilon) over the axes from `axis` on, times scale (LayerNorm without the mean)."""
    axes = tuple(range(axis % x.ndim, x.ndim))
    xf = x.astype(np.float32, copy=False) if stash_type == 1 and x.dtype != np.float64 else x
    rms = np.sqrt(np.mean(np.square(xf), axis=axes, keepdims=True) + epsilon)
    return ((xf / rms).astype(x.dtype) * scale).astype(x.dtype)


def _group_norm(x, scale, bias, num_groups, epsilon, per_channel, stash_type=1):
    N, C = x.shape[:2]
    xf = x.astype(np.float32, copy=False) if stash_type == 1 and x.dtype != np.float64 else x
    g = xf.reshape(N, num_groups, -1)                          # each group's channels and positions together
    y = (g - g.mean(axis=2, keepdims=True)) / np.sqrt(g.var(axis=2, keepdims=True) + epsilon)
    y = y.reshape(x.shape).astype(x.dtype)
    shape = (1, C) + (1,) * (x.ndim - 2)
    if not per_channel:                                        # opset 18: one scale and bias per group
        scale, bias = np.repeat(scale, C // num_groups), np.repeat(bias, C // num_groups)
    return (y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


@register("GroupNormalization", since=18)
def group_norm_18(x, scale, bias, *, num_groups, epsilon=1e-5):
    """Normalize each group of C / num_groups channels of each sample; scale and bias per group."""
    return _group_norm(x, scale, bias, num_groups, epsilon, per_channel=False)


@register("GroupNormalization", since=21)
def group_norm_21(x, scale, bias, *, num_groups, epsilon=1e-5, stash_type=1):
    """As opset 18, but scale and bias per channel, and the statistics in float32 (stash_type=1)."""
    return _group_norm(x, scale, bias, num_groups, epsilon, per_channel=True, stash_type=stash_type)


@register("LpPool", since=11)
def lp_pool(x, *, kernel_shape, p=2, auto_pad="NOTSET", ceil_mode=0, dilations=None, pads=None, strides=None):
    """(sum over each window of |x|^p)^(1/p); padding counts as 0."""
    geometry = _geometry(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    total = _pool(np.add, _padded(np.abs(x) ** p, geometry, 0), geometry[2])
    return (total ** (1.0 / p)).astype(x.dtype)
