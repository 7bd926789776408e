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
    """A 0 copies the input's size on that axis (unless allowzero); one -1 takes what is left."""
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
