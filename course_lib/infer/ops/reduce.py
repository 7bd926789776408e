"""Reductions. Since opset 18 (13 for ReduceSum) the axes are an input rather than an attribute."""

import numpy as np

from ..registry import register

_EMPTY = {"ReduceMax": -np.inf, "ReduceMin": np.inf}

_FNS = {
    "ReduceSum": lambda x, ax, kd: np.sum(x, axis=ax, keepdims=kd),
    "ReduceMean": lambda x, ax, kd: np.mean(x, axis=ax, keepdims=kd),
    "ReduceMax": lambda x, ax, kd: np.max(x, axis=ax, keepdims=kd),
    "ReduceMin": lambda x, ax, kd: np.min(x, axis=ax, keepdims=kd),
    "ReduceProd": lambda x, ax, kd: np.prod(x, axis=ax, keepdims=kd),
    "ReduceL1": lambda x, ax, kd: np.sum(np.abs(x), axis=ax, keepdims=kd),
    "ReduceL2": lambda x, ax, kd: np.sqrt(np.sum(np.square(x), axis=ax, keepdims=kd)),
    "ReduceSumSquare": lambda x, ax, kd: np.sum(np.square(x), axis=ax, keepdims=kd),
    "ReduceLogSum": lambda x, ax, kd: np.log(np.sum(x, axis=ax, keepdims=kd)),
    "ReduceLogSumExp": lambda x, ax, kd: np.log(np.sum(np.exp(x), axis=ax, keepdims=kd)),
}


def _reduce(name, x, axes, keepdims, noop_with_empty_axes):
    if axes is None or len(axes) == 0:
        if noop_with_empty_axes:
            return x
        axes = tuple(range(x.ndim))
    axes = tuple(int(a) % max(x.ndim, 1) for a in np.asarray(axes).reshape(-1))
    if x.size == 0 and name in _EMPTY:  # the max of nothing is -inf, as for an empty sum it is 0
        shape = [1 if i in axes else s for i, s in enumerate(x.shape)] if keepdims else \
            [s for i, s in enumerate(x.shape) if i not in axes]
        big = name == "ReduceMin"
        if x.dtype == bool:
            fill = big
        elif x.dtype.kind in "iu":
            fill = np.iinfo(x.dtype).max if big else np.iinfo(x.dtype).min
        else:
            fill = _EMPTY[name]
        return np.full(shape, fill, dtype=x.dtype)
    return np.asarray(_FNS[name](x, axes, bool(keepdims))).astype(x.dtype, copy=False)


def _with_input_axes(name):
    def kernel(x, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        return _reduce(name, x, None if axes is None else axes.tolist(), keepdims, noop_with_empty_axes)
    return kernel


def _with_attr_axes(name):
    def kernel(x, *, axes=None, keepdims=1):
        return _reduce(name, x, axes, keepdims, 0)
    return kernel


for _name in _FNS:
    register(_name, since=1)(_with_attr_axes(_name))
    register(_name, since=13 if _name == "ReduceSum" else 18)(_with_input_axes(_name))
