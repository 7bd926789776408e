"""Image ops: Resize (nearest, linear, cubic; with antialiasing) and GridSample.

Resize is separable: each resized axis is one matrix product with a (out, in) matrix of weights,
whose row i says how much each input position contributes to output position i. The coordinate
transformation modes only change where the output position lands in the input.
"""

import math

import numpy as np

from ..registry import Unsupported, register


def _source(i, in_len, out_len, scale, mode, roi=(0.0, 1.0)):
    """Where output positions i land in the input (floats), for each coordinate_transformation_mode.

    out_len is the output length before rounding down (in_len * scale) when scales set it."""
    if mode == "half_pixel":
        return (i + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = math.floor(out_len) / (in_len * scale)
        return in_len / 2 * (1 - adjustment) + (i + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (i + 0.5) / scale - 0.5 if int(out_len) > 1 else np.zeros_like(i)
    if mode == "align_corners":
        return i * (in_len - 1) / (out_len - 1) if out_len > 1 else np.zeros_like(i)
    if mode == "asymmetric":
        return i / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        if out_len > 1:
            return start * (in_len - 1) + i * (end - start) * (in_len - 1) / (out_len - 1)
        return np.full_like(i, 0.5 * (start + end) * (in_len - 1))
    raise Unsupported(f"Resize's coordinate_transformation_mode {mode!r}")


def _cubic(t, a):
    """The cubic convolution kernel (Keys): 1 at 0, 0 at the other integers, support |t| < 2."""
    t = np.abs(t)
    return np.where(t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1,
                    np.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0))


def _nearest(x, rule):
    if rule == "round_prefer_floor":
        return np.ceil(x - 0.5)
    if rule == "round_prefer_ceil":
        return np.floor(x + 0.5)
    if rule == "floor":
        return np.floor(x)
    if rule == "ceil":
        return np.ceil(x)
    raise Unsupported(f"Resize's nearest_mode {rule!r}")


def _weights(in_len, out_len, exact_len, scale, mode, rule, coordinate, roi, a, exclude_outside, antialias):
    """(W (out, in), outside (out,)): the interpolation weights along one axis, and which outputs fall
    outside the input (tf_crop_and_resize gives those extrapolation_value). Outside taps repeat the
    edge value (or, with exclude_outside, weigh nothing); the rows are normalized to sum to 1."""
    x = _source(np.arange(out_len, dtype=np.float64), in_len, exact_len, scale, coordinate, roi)
    outside = (x < 0) | (x > in_len - 1)
    W = np.zeros((out_len, in_len))
    rows = np.arange(out_len)
    if mode == "nearest":
        W[rows, np.clip(_nearest(x, rule), 0, in_len - 1).astype(np.int64)] = 1
        return W, outside
    kernel = (lambda t: np.maximum(0.0, 1 - np.abs(t))) if mode == "linear" else (lambda t: _cubic(t, a))
    support = 1 if mode == "linear" else 2
    stretch = 1 / scale if antialias and scale < 1 else 1.0   # antialiasing widens the filter when shrinking
    reach = math.ceil(support * stretch)
    base = np.floor(x).astype(np.int64)
    for off in range(-reach + 1, reach + 1):                   # the taps around each source position
        j = base + off
        w = kernel((j - x) / stretch)
        inside = (j >= 0) & (j < in_len)
        if exclude_outside:
            w = np.where(inside, w, 0.0)
        np.add.at(W, (rows, np.clip(j, 0, in_len - 1)), w)     # outside taps repeat the edge value
    return W / W.sum(axis=1, keepdims=True), outside


def _resize(x, roi, scales, sizes, *, antialias=0, axes=None, coordinate_transformation_mode="half_pixel",
            cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, keep_aspect_ratio_policy="stretch",
            mode="nearest", nearest_mode="round_prefer_floor"):
    axes = [a % x.ndim for a in (axes if axes is not None else range(x.ndim))]
    n = len(axes)
    roi = np.asarray(roi, np.float64).reshape(-1) if roi is not None and roi.size else None
    if sizes is not None and sizes.size:
        want = [int(s) for s in sizes.reshape(-1)]
        ratio = [w / x.shape[a] for w, a in zip(want, axes)]
        if keep_aspect_ratio_policy != "stretch":
            r = min(ratio) if keep_aspect_ratio_policy == "not_larger" else max(ratio)
            ratio = [r] * n
            want = [int(math.floor(r * x.shape[a] + 0.5)) for a in axes]
        out, scale, exact = want, ratio, want
    else:
        scale = [float(s) for s in scales.reshape(-1)]
        spans = [1.0] * n if roi is None or coordinate_transformation_mode != "tf_crop_and_resize" else \
            [float(roi[n + k] - roi[k]) for k in range(n)]
        exact = [x.shape[a] * s * span for a, s, span in zip(axes, scale, spans)]
        out = [int(math.floor(e)) for e in exact]
    y = x.astype(np.float64)
    outside = np.zeros(tuple(out[axes.index(d)] if d in axes else x.shape[d] for d in range(x.ndim)), bool)
    for k, axis in enumerate(axes):
        if out[k] == x.shape[axis] and scale[k] == 1 and coordinate_transformation_mode != "tf_crop_and_resize":
            continue
        box = (roi[k], roi[n + k]) if roi is not None else (0.0, 1.0)
        W, off = _weights(x.shape[axis], out[k], exact[k], scale[k], mode, nearest_mode, coordinate_transformation_mode,
                          box, cubic_coeff_a, exclude_outside, antialias)
        y = np.moveaxis(np.tensordot(W, np.moveaxis(y, axis, 0), axes=1), 0, axis)
        if coordinate_transformation_mode == "tf_crop_and_resize":
            shape = [1] * x.ndim
            shape[axis] = out[k]
            outside |= off.reshape(shape)
    if coordinate_transformation_mode == "tf_crop_and_resize":
        y = np.where(outside, extrapolation_value, y)
    if x.dtype.kind in "iu":
        y = np.rint(y)
    return y.astype(x.dtype)


@register("Resize", since=10)
def resize_10(x, scales, *, mode="nearest"):
    """Opset 10: scales only; positions map as in "asymmetric" and nearest rounds down."""
    return _resize(x, None, scales, None, mode=mode, coordinate_transformation_mode="asymmetric",
                   nearest_mode="floor" if mode == "nearest" else "round_prefer_floor")


@register("Resize", since=11)
def resize_11(x, roi=None, scales=None, sizes=None, *, coordinate_transformation_mode="half_pixel",
              cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, mode="nearest",
              nearest_mode="round_prefer_floor"):
    return _resize(x, roi, scales, sizes, coordinate_transformation_mode=coordinate_transformation_mode,
                   cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
                   extrapolation_value=extrapolation_value, mode=mode, nearest_mode=nearest_mode)


@register("Resize", since=18)
def resize_18(x, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
              coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
              extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
              nearest_mode="round_prefer_floor"):
    """Opset 18 adds antialias, axes and keep_aspect_ratio_policy (opset 19: "half_pixel_symmetric")."""
    return _resize(x, roi, scales, sizes, antialias=antialias, axes=axes,
                   coordinate_transformation_mode=coordinate_transformation_mode, cubic_coeff_a=cubic_coeff_a,
                   exclude_outside=exclude_outside, extrapolation_value=extrapolation_value,
                   keep_aspect_ratio_policy=keep_aspect_ratio_policy, mode=mode, nearest_mode=nearest_mode)
