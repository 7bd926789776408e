"""Kernels that move data without arithmetic: shapes, reshapes, slicing, gathering, constants."""

import math

import numpy as np

from ..registry import Unsupported, register
from .elementwise import NUMPY_TYPES


def _ints(x):
    return [int(v) for v in np.asarray(x).reshape(-1)]


@register("Shape", since=1)
def shape(x, *, start=0, end=None):
    return np.array(x.shape[start:end], dtype=np.int64)


@register("Size", since=1)
def size(x):
    return np.array(x.size, dtype=np.int64)


@register("Reshape", since=5)
def reshape(x, shape, *, allowzero=0):
    """The course's answer to exercise 09.4 (`reshape`): read it once your check passes.

    A 0 copies the input's size on that axis (unless allowzero); one -1 takes what is left."""
    shape = _ints(shape)
    if not allowzero:
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


@register("Flatten", since=1)
def flatten(x, *, axis=1):
    axis = axis + x.ndim if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@register("Transpose", since=1)
def transpose(x, *, perm=None):
    return np.transpose(x, perm)


@register("Squeeze", since=13)
def squeeze(x, axes=None):
    return np.squeeze(x, axis=None if axes is None else tuple(_ints(axes)))


@register("Squeeze", since=1)
def squeeze_1(x, *, axes=None):
    return np.squeeze(x, axis=None if axes is None else tuple(axes))


def _unsqueeze(x, axes):
    ndim = x.ndim + len(axes)
    for a in sorted(a % ndim for a in axes):
        x = np.expand_dims(x, a)
    return x


@register("Unsqueeze", since=13)
def unsqueeze(x, axes):
    return _unsqueeze(x, _ints(axes))


@register("Unsqueeze", since=1)
def unsqueeze_1(x, *, axes):
    return _unsqueeze(x, list(axes))


@register("Concat", since=4)
def concat(*xs, axis):
    return np.concatenate(xs, axis=axis)


def _split(x, axis, split, n):
    if split is None:
        size = -(-x.shape[axis] // n)  # ceil: the last chunk may be smaller
        split = [size] * (n - 1) + [x.shape[axis] - size * (n - 1)]
    return tuple(np.split(x, np.cumsum(split)[:-1], axis=axis))


@register("Split", since=13)
def split(x, split=None, *, axis=0, num_outputs=None, _n_outputs=1):
    return _split(x, axis, None if split is None else _ints(split), num_outputs or _n_outputs)


@register("Split", since=2)
def split_2(x, *, axis=0, split=None, _n_outputs=1):
    return _split(x, axis, split, _n_outputs)


@register("Slice", since=10)
def slice_(x, starts, ends, axes=None, steps=None):
    starts, ends = _ints(starts), _ints(ends)
    axes = list(range(len(starts))) if axes is None else _ints(axes)
    steps = [1] * len(starts) if steps is None else _ints(steps)
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        n = x.shape[a]
        s, e = s + n if s < 0 else s, e + n if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), n), min(max(e, 0), n)
        else:  # walking backwards, an end of -1 means 'through index 0'
            s, e = min(max(s, 0), n - 1), min(max(e, -1), n - 1)
        index[a] = slice(s, e if e >= 0 else None, st)
    return x[tuple(index)]


@register("Slice", since=1)
def slice_1(x, *, starts, ends, axes=None):
    return slice_(x, starts, ends, axes)


@register("Gather", since=1)
def gather(x, indices, *, axis=0):
    return np.take(x, np.where(indices < 0, indices + x.shape[axis], indices), axis=axis)


@register("GatherElements", since=11)
def gather_elements(x, indices, *, axis=0):
    return np.take_along_axis(x, np.where(indices < 0, indices + x.shape[axis], indices), axis=axis)


@register("Expand", since=8)
def expand(x, shape):
    shape = _ints(shape)
    return x * np.ones(shape, dtype=x.dtype) if x.dtype != bool else np.logical_and(x, np.ones(shape, bool))


@register("Tile", since=6)
def tile(x, repeats):
    return np.tile(x, _ints(repeats))


@register("Constant", since=1)
def constant(*, value=None, value_float=None, value_floats=None, value_int=None, value_ints=None):
    if value is not None:
        return value
    if value_float is not None:
        return np.array(value_float, dtype=np.float32)
    if value_floats is not None:
        return np.array(value_floats, dtype=np.float32)
    if value_int is not None:
        return np.array(value_int, dtype=np.int64)
    if value_ints is not None:
        return np.array(value_ints, dtype=np.int64)
    raise Unsupported("Constant without a value (sparse or string constants)")


@register("ConstantOfShape", since=9)
def constant_of_shape(shape, *, value=None):
    v = np.zeros(1, np.float32) if value is None else value
    return np.full(_ints(shape), v.reshape(-1)[0], dtype=v.dtype)


@register("Trilu", since=14)
def trilu(x, k=None, *, upper=1):
    k = 0 if k is None else int(np.asarray(k).reshape(()))
    return np.triu(x, k) if upper else np.tril(x, k)


@register("Range", since=11)
def range_(start, limit, delta):
    """start, start + delta, ... up to limit (excluded). The three are scalars (a 1-element tensor will do)."""
    start, limit, delta = (v.reshape(()) if v.size == 1 else v for v in (start, limit, delta))
    return np.arange(start, limit, delta, dtype=start.dtype)


@register("EyeLike", since=9)
def eye_like(x, *, dtype=None, k=0):
    dt = x.dtype if dtype is None else NUMPY_TYPES.get(dtype)
    if dt is None:
        raise Unsupported(f"EyeLike with ONNX type {dtype}")
    return np.eye(x.shape[0], x.shape[1], k=k, dtype=dt)


@register("OneHot", since=11)
def one_hot(indices, depth, values, *, axis=-1):
    depth = int(np.asarray(depth).reshape(-1)[0])
    idx = np.where(indices < 0, indices + depth, indices).astype(np.int64)
    hot = np.arange(depth) == idx[..., None]
    out = np.where(hot, values[1], values[0])
    return np.moveaxis(out, -1, axis if axis >= 0 else out.ndim + axis)


@register("NonZero", since=9)
def non_zero(x):
    return np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)


@register("Pad", since=11)
def pad(x, pads, value=None, axes=None, *, mode="constant"):
    pads = _ints(pads)
    axes = list(range(x.ndim)) if axes is None else [a % x.ndim for a in _ints(axes)]
    width = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        width[a] = (pads[i], pads[i + len(axes)])
    if mode == "constant":
        v = 0 if value is None or np.asarray(value).size == 0 else np.asarray(value).reshape(-1)[0]
        return np.pad(x, width, mode="constant", constant_values=v)
    if mode in ("reflect", "edge", "wrap"):
        return np.pad(x, width, mode=mode)
    raise Unsupported(f"Pad mode {mode!r}")


@register("DepthToSpace", since=13)
def depth_to_space(x, *, blocksize, mode="DCR"):
    n, c, h, w = x.shape
    b = blocksize
    if mode == "DCR":
        y = x.reshape(n, b, b, c // b**2, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // b**2, b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // b**2, h * b, w * b)


@register("SpaceToDepth", since=13)
def space_to_depth(x, *, blocksize):
    n, c, h, w = x.shape
    b = blocksize
    y = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


@register("Compress", since=11)
def compress(x, condition, *, axis=None):
    return np.compress(condition, x, axis=axis)


@register("SpaceToDepth", since=28)
def space_to_depth_28(x, *, blocksize, mode="DCR"):
    """Opset 28 adds CRD order: each channel's b x b block side by side, instead of block position first."""
    if mode == "DCR":
        return space_to_depth(x, blocksize=blocksize)
    n, c, h, w = x.shape
    b = blocksize
    return x.reshape(n, c, h // b, b, w // b, b).transpose(0, 1, 3, 5, 2, 4).reshape(n, c * b * b, h // b, w // b)


# ---- scatters and gathers by index tensors -------------------------------------------------

_AT = {"add": np.add.at, "mul": np.multiply.at, "max": np.maximum.at, "min": np.minimum.at}


def _write(out, where, updates, reduction):
    """out[where] = updates, or combined with what is there (reduction); repeated positions accumulate."""
    if reduction == "none":
        out[where] = updates
    elif reduction in _AT:
        _AT[reduction](out, where, updates)
    else:
        raise Unsupported(f"scatter reduction {reduction!r}")
    return out


def _scatter_elements(data, indices, updates, axis, reduction):
    axis %= data.ndim
    idx = np.where(indices < 0, indices + data.shape[axis], indices)
    where = list(np.indices(indices.shape, sparse=True))
    where[axis] = idx
    return _write(data.copy(), tuple(where), updates, reduction)


@register("ScatterElements", since=11)
def scatter_elements(data, indices, updates, *, axis=0, reduction="none"):
    """out = data, then out[..., indices[i, j], ...] = updates[i, j] along `axis` (or added, multiplied,
    kept the max or min of, with `reduction`)."""
    return _scatter_elements(data, indices, updates, axis, reduction)


@register("Scatter", since=9)
def scatter(data, indices, updates, *, axis=0):
    """The old name of ScatterElements, without reduction."""
    return _scatter_elements(data, indices, updates, axis, "none")


@register("ScatterND", since=11)
def scatter_nd(data, indices, updates, *, reduction="none"):
    """out = data, then out[indices[i][0], ..., indices[i][k-1]] = updates[i] for each index tuple i
    (the last axis of indices holds k coordinates; updates slices fill the remaining axes)."""
    k = indices.shape[-1]
    idx = indices.reshape(-1, k)
    idx = np.where(idx < 0, idx + np.array(data.shape[:k]), idx)
    return _write(data.copy(), tuple(idx.T), updates.reshape((-1,) + data.shape[k:]), reduction)


@register("GatherND", since=11)
def gather_nd(data, indices, *, batch_dims=0):
    """out[b..., i...] = data[b..., indices[b..., i..., 0], ..., indices[b..., i..., k-1]]: the last axis
    of indices holds k coordinates into data (after its first batch_dims axes, shared with indices)."""
    batch = data.shape[:batch_dims]
    n = int(np.prod(batch))
    d = data.reshape((n,) + data.shape[batch_dims:])
    ind = indices.reshape((n,) + indices.shape[batch_dims:])
    k = ind.shape[-1]
    out = [d[b][tuple(np.moveaxis(np.where(ind[b] < 0, ind[b] + np.array(d.shape[1:1 + k]), ind[b]), -1, 0))]
           for b in range(n)]
    return np.stack(out).reshape(batch + indices.shape[batch_dims:-1] + data.shape[batch_dims + k:])


@register("TensorScatter", since=24)
def tensor_scatter(past_cache, update, write_indices=None, *, axis=-2, mode="linear"):
    """A KV cache update: copy `update` into the cache along `axis`, at write_indices[b] for batch entry b
    (0 when not given); positions wrap around the cache's length in mode "circular"."""
    axis %= past_cache.ndim
    out = past_cache.copy()
    length, steps = past_cache.shape[axis], update.shape[axis]
    for b in range(past_cache.shape[0]):
        start = 0 if write_indices is None else int(write_indices[b])
        pos = start + np.arange(steps)
        if mode == "circular":
            pos %= length
        dst = np.moveaxis(out[b], axis - 1, 0)              # a view: writing it writes out
        dst[pos] = np.moveaxis(update[b], axis - 1, 0)
    return out


@register("ReverseSequence", since=10)
def reverse_sequence(x, sequence_lens, *, batch_axis=1, time_axis=0):
    """Reverse the first sequence_lens[b] steps (along time_axis) of each batch entry b."""
    y = x.copy()
    for b, n in enumerate(np.asarray(sequence_lens).reshape(-1)):
        src = [slice(None)] * x.ndim
        src[batch_axis], src[time_axis] = b, slice(0, int(n))
        dst = list(src)
        dst[time_axis] = slice(int(n) - 1, None, -1) if n > 0 else slice(0, 0)
        y[tuple(dst)] = x[tuple(src)]
    return y


@register("CenterCropPad", since=18)
def center_crop_pad(x, shape, *, axes=None):
    """Crop or zero-pad each of `axes` to its size in `shape`, keeping the center."""
    axes = [a % x.ndim for a in (axes if axes is not None else range(x.ndim))]
    y = x
    for a, size in zip(axes, _ints(shape)):
        n = y.shape[a]
        if size < n:
            start = (n - size) // 2
            y = np.take(y, np.arange(start, start + size), axis=a)
        elif size > n:
            before = (size - n) // 2
            pad = [(0, 0)] * y.ndim
            pad[a] = (before, size - n - before)
            y = np.pad(y, pad)
    return y


@register("Unique", since=11)
def unique(x, *, axis=None, sorted=1, _n_outputs=1):
    """The distinct values (or slices along `axis`), sorted or in order of first appearance; optional
    outputs: where each first appears, where each input element went, how often each appears."""
    values, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True,
                                               axis=axis)
    inverse = inverse.reshape(-1)
    if not sorted:                                      # renumber by first appearance
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        values = np.take(values, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    outs = (values, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64))
    return outs[:_n_outputs] if _n_outputs > 1 else outs[0]
