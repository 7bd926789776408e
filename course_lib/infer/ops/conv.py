"""Convolution as an inference engine runs it: one matrix product per group for the whole batch.

    cols = x.take(index)        # im2col: (C * k, out * N) through gather indices made once per shape
    y = w_packed @ cols         # w_packed: (M, C * k), the weights laid out once for this product
    y += b; max(y, 0)           # bias and Relu, in place on the product's own buffer

The gather index depends only on the input's shape and the convolution's attributes, so it is
computed once per shape and kept (`conv_plan`). The weights depend on nothing at run time, so
the `fuse_conv` pass (passes.py) packs them once, when the session is created, into a `FusedConv`
node; plain `Conv` packs them on every call. Both run `conv_packed`, so they compute the same bits.

Two layout choices make it fast:

- Padding costs nothing extra: the input is copied once into a flat buffer with one more element,
  a zero, and every window cell that falls in the padding gathers that zero.
- The batch is the innermost axis of the buffer and of the product's columns (C, H, W, N), so the
  gather reads runs of N neighbours and the output comes out as (M, H, W, N) in memory, returned as
  an (N, M, H, W) view. A pool or a Relu after it then works along runs of N, which numpy vectorizes;
  in the usual (N, C, H, W) layout a 2 x 2 pool reads every other element, which it does not.
"""

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..registry import register
from .nn import max_pool, pads_for


@dataclass(frozen=True)
class ConvPlan:
    """How to run a convolution on inputs of one shape: worked out once (`conv_plan`) and kept."""
    out: tuple             # the output's spatial size
    padded: tuple          # the input laid out as (C, *padded size, N)
    interior: tuple        # where the input goes in that buffer (the rest is the zero padding)
    windows: list | None   # per kernel offset, the slice of the padded buffer it reads; or None, and:
    index: np.ndarray | None   # gather indices into the unpadded buffer followed by a 0 and a 1


WINDOWS_FROM = 2048   # cells of cols per kernel offset from which copying windows beats one gather


@functools.lru_cache(maxsize=128)
def conv_plan(shape, kernel, auto_pad, dilations, pads, strides):
    """The ConvPlan of a convolution of an input of `shape` (N, C, *size).

    im2col builds cols (C * prod(kernel) + 1, prod(out) * N): row (channel, kernel offset), column
    (output position, image) holds the input cell that window position reads; the last row is all
    ones, so that a bias packed as the weights' last column is added by the product itself.
    Two ways to build it, the same numbers:
    - windows: for each kernel offset, copy one strided slice of a zero-padded (C, *padded, N) buffer
      into its rows; prod(kernel) copies of long runs, the fastest way for a batch;
    - index: one `take` through indices into the unpadded buffer followed by a 0, which every padding
      cell reads, and a 1, which the last row reads; a single call, the fastest way for a small image.
    """
    (n, c), size = shape[:2], shape[2:]
    strides, dilations = strides or (1,) * len(size), dilations or (1,) * len(size)
    pads = pads_for(auto_pad, pads, size, kernel, strides, dilations)
    out = tuple((sz + p0 + p1 - (k - 1) * d - 1) // s + 1
                for sz, k, s, d, (p0, p1) in zip(size, kernel, strides, dilations, pads))
    padded = (c,) + tuple(sz + p0 + p1 for sz, (p0, p1) in zip(size, pads)) + (n,)
    interior = (slice(None),) + tuple(slice(p0, p0 + sz) for sz, (p0, _) in zip(size, pads))
    if c * math.prod(out) * n >= WINDOWS_FROM:   # each copy moves enough to outweigh its Python call
        windows = [(slice(None),) + tuple(slice(a * d, a * d + s * (o - 1) + 1, s)
                                          for a, d, s, o in zip(offset, dilations, strides, out))
                   for offset in itertools.product(*(range(k) for k in kernel))]
        return ConvPlan(out, padded, interior, windows, None)
    offset, valid = np.zeros((), np.intp), np.ones((), bool)
    for i, (sz, k, s, d, (p0, _)) in enumerate(zip(size, kernel, strides, dilations, pads)):
        coord = np.arange(k)[:, None] * d + np.arange(out[i])[None, :] * s - p0   # (k, o): the row or column read
        axes = [1] * (2 * len(size))
        axes[i], axes[len(size) + i] = k, out[i]                               # kernel axes first, then output axes
        offset = offset * sz + coord.reshape(axes)
        valid = valid & ((coord >= 0) & (coord < sz)).reshape(axes)
    k_total, p_total, plane = math.prod(kernel), math.prod(out), math.prod(size)
    offset, valid = offset.reshape(k_total, p_total), valid.reshape(k_total, p_total)
    cell = np.arange(c)[:, None, None] * plane + offset                         # (c, k, p) in one image
    index = cell[:, :, :, None] * n + np.arange(n)                              # (c, k, p, n): images innermost
    index = np.where(valid[None, :, :, None], index, c * plane * n)            # padding reads the 0
    ones = np.full((1, p_total * n), c * plane * n + 1)                         # the last row reads the 1
    return ConvPlan(out, padded, interior, None, np.concatenate([index.reshape(c * k_total, -1), ones]))


def _tuple(v):
    return None if v is None else tuple(v)


def pack_weights(w, group, b=None):
    """(M, C/G, *k) -> (G, M/G, C/G * prod(k)), contiguous: the left operand of each group's product.

    With one group and a bias b (M,), b is the last column: the product adds it (cols' row of ones)."""
    w = w.reshape(group, w.shape[0] // group, -1)
    if b is not None and group == 1:
        return np.concatenate([w, b.reshape(1, -1, 1).astype(w.dtype)], axis=2)
    return np.ascontiguousarray(w)


def im2col(x, plan, rows):
    """cols (rows, prod(out) * N) of x (N, C, *size), the batch innermost: C * prod(kernel) rows from x,
    then a row of ones when rows asks for one more."""
    to_cnhw = (1,) + tuple(range(2, x.ndim)) + (0,)                        # (N, C, *size) -> (C, *size, N)
    if plan.windows is None:
        flat = np.concatenate([x.transpose(to_cnhw).reshape(-1), ZERO_ONE], dtype=x.dtype)
        return flat.take(plan.index if rows == len(plan.index) else plan.index[:-1], axis=0, mode="clip")
    xp = np.zeros(plan.padded, x.dtype)
    xp[plan.interior] = x.transpose(to_cnhw)
    cols = np.empty((rows, math.prod(plan.out) * x.shape[0]), x.dtype)
    cells = cols[:x.shape[1] * len(plan.windows)].reshape((x.shape[1], len(plan.windows)) + plan.out + x.shape[:1])
    for k, window in enumerate(plan.windows):
        cells[:, k] = xp[window]
    if rows > x.shape[1] * len(plan.windows):
        cols[-1] = 1
    return cols


ZERO_ONE = np.array([0, 1])


def conv_packed(x, w_packed, b, kernel, auto_pad, dilations, pads, strides, relu=False, out=None):
    """Conv of x (N, C, *size) with packed weights (G, M/G, C/G * prod(kernel), or one column more:
    the bias); a bias b (a column (M, 1) of x's dtype, or None) and Relu in place after the product.

    Returns an (N, M, *out) view of a (M, *out, N) buffer: `out` when it is given (a flat buffer of
    the output's size, from the session's memory plan)."""
    plan = conv_plan(x.shape, tuple(kernel), auto_pad, _tuple(dilations), _tuple(pads), _tuple(strides))
    G, Mg, K = w_packed.shape
    cols = im2col(x, plan, G * K)
    if out is not None and out.size != G * Mg * cols.shape[1]:
        out = None                                             # a plan made for other shapes: not this buffer
    y = None if out is None else out.reshape(G * Mg, -1)
    if G == 1:
        y = np.matmul(w_packed[0], cols, out=y)                # one BLAS call for the whole batch
    else:
        y = np.matmul(w_packed, cols.reshape(G, K, -1), out=None if y is None else y.reshape(G, Mg, -1))
        y = y.reshape(G * Mg, -1)
    if b is not None:
        y += b
    if relu:
        np.maximum(y, 0, out=y)
    # (M, P * N) -> (N, M, *out): a view with the batch axis moved to the front, no copy
    return y.reshape((G * Mg,) + plan.out + x.shape[:1]).transpose((x.ndim - 1,) + tuple(range(x.ndim - 1)))


def bias_column(b, dtype):
    return None if b is None else b.reshape(-1, 1).astype(dtype, copy=False)


@register("Conv", since=1)
def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Convolution as im2col + one matrix product per group (the weights packed on every call)."""
    w = w.astype(x.dtype, copy=False)
    packed = pack_weights(w, group, b)
    after = bias_column(b, x.dtype) if b is not None and group > 1 else None   # the product adds it when G = 1
    return conv_packed(x, packed, after, w.shape[2:], auto_pad, dilations, pads, strides)


POOL = ("kernel_shape", "auto_pad", "ceil_mode", "dilations", "pads", "strides")   # MaxPool's attributes


@register("FusedConv", since=1, domain="course")
def fused_conv(x, w_packed, b=None, *, kernel_shape, auto_pad="NOTSET", dilations=None, group=1, pads=None,
               strides=None, activation="", pool_kernel_shape=None, pool_auto_pad="NOTSET", pool_ceil_mode=0,
               pool_dilations=None, pool_pads=None, pool_strides=None, out=None):
    """Conv with the weights packed by the `fuse_conv` pass (b: a column (M, 1)), its bias in place, then
    with pool_kernel_shape a MaxPool (attributes pool_*), then activation="Relu" in place.

    The Relu comes after the pool: max(relu(a), relu(b)) = relu(max(a, b)), exactly, and the pooled
    tensor is smaller. `group` is already in the packed weights' shape."""
    if pool_kernel_shape is None:
        return conv_packed(x, w_packed, b, kernel_shape, auto_pad, dilations, pads, strides, activation == "Relu", out)
    y = conv_packed(x, w_packed, b, kernel_shape, auto_pad, dilations, pads, strides)
    y = max_pool(y, kernel_shape=pool_kernel_shape, auto_pad=pool_auto_pad, ceil_mode=pool_ceil_mode,
                 dilations=pool_dilations, pads=pool_pads, strides=pool_strides)    # a fresh array
    if activation == "Relu":
        np.maximum(y, 0, out=y)
    return y


# ---- the way back: columns summed into images (ConvTranspose, Col2Im) ---------------------------

def col2im(cols, n, c, size, kernel, grid, strides, dilations, pad_begin):
    """Images (n, c, *size) from cols (c, prod(kernel), n, prod(grid)): the value of kernel offset a at
    block position p lands on a * dilation + p * stride - pad_begin (per axis) and overlapping values
    add up; what lands outside the image is dropped. The inverse of im2col's gather is this scatter."""
    offset, valid = np.zeros((), np.intp), np.ones((), bool)
    for i, (sz, k, g, s, d, p0) in enumerate(zip(size, kernel, grid, strides, dilations, pad_begin)):
        coord = np.arange(k)[:, None] * d + np.arange(g)[None, :] * s - p0        # (k, g)
        axes = [1] * (2 * len(size))
        axes[i], axes[len(size) + i] = k, g
        offset = offset * sz + coord.reshape(axes)
        valid = valid & ((coord >= 0) & (coord < sz)).reshape(axes)
    K, P, plane = math.prod(kernel), math.prod(grid), math.prod(size)
    offset, valid = offset.reshape(K, P), valid.reshape(K, P)
    planes = (np.arange(n)[None, :] * c + np.arange(c)[:, None]) * plane        # (c, n): where each plane starts
    index = planes[:, None, :, None] + offset[None, :, None, :]                 # (c, k, n, p)
    index = np.where(valid[None, :, None, :], index, n * c * plane)            # outside: one extra bin
    total = np.bincount(index.reshape(-1), weights=cols.reshape(-1), minlength=n * c * plane + 1)
    return total[:-1].reshape(n, c, *size).astype(cols.dtype)


@register("ConvTranspose", since=1)
def conv_transpose(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                   output_padding=None, output_shape=None, pads=None, strides=None):
    """The transpose of Conv (its gradient with respect to the input): each input position spreads
    w times its value over a window of the output. One product per group, then col2im."""
    N, C, *size = x.shape
    nd, G = len(size), group
    kernel = list(w.shape[2:])
    strides, dilations = strides or [1] * nd, dilations or [1] * nd
    output_padding = output_padding or [0] * nd
    span = [s * (i - 1) + op + (k - 1) * d + 1 for s, i, op, k, d in zip(strides, size, output_padding, kernel, dilations)]
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = list(output_shape[-nd:]) if output_shape is not None else [i * s for i, s in zip(size, strides)]
        total = [max(sp - o, 0) for sp, o in zip(span, out)]   # an output longer than the span grows at the end
        upper = auto_pad != "SAME_LOWER"
        begin = [t // 2 if upper else t - t // 2 for t in total]
    else:
        pads = pads or [0] * 2 * nd
        begin = pads[:nd]
        out = [sp - pads[i] - pads[nd + i] for i, sp in enumerate(span)]
    M = w.shape[1] * G
    xg = x.reshape(N, G, C // G, -1).transpose(1, 2, 0, 3).reshape(G, C // G, -1)          # (G, C/G, N * P)
    wg = w.reshape(G, C // G, -1).transpose(0, 2, 1)                                       # (G, M/G * k, C/G)
    cols = np.matmul(wg, xg).reshape(M, math.prod(kernel), N, -1)                          # (M, k, N, P)
    y = col2im(cols, N, M, out, kernel, size, strides, dilations, begin)
    if b is not None:
        y += b.reshape((1, M) + (1,) * nd).astype(y.dtype)
    return y


@register("Col2Im", since=18)
def col2im_op(x, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    """x (N, C * prod(block), L) -> images (N, C, *image_shape): sliding blocks summed back in place."""
    image, kernel = [int(v) for v in image_shape], [int(v) for v in block_shape]
    nd = len(image)
    strides, dilations, pads = strides or [1] * nd, dilations or [1] * nd, pads or [0] * 2 * nd
    grid = [(i + pads[k] + pads[nd + k] - (b - 1) * d - 1) // s + 1
            for k, (i, b, d, s) in enumerate(zip(image, kernel, dilations, strides))]
    N, CK, L = x.shape
    C = CK // math.prod(kernel)
    cols = x.reshape(N, C, math.prod(kernel), L).transpose(1, 2, 0, 3)                     # (C, k, N, L)
    return col2im(cols, N, C, image, kernel, grid, strides, dilations, pads[:nd])


@register("CausalConvWithState", since=27)
def causal_conv_with_state(x, w, b=None, past_state=None, *, activation="none"):
    """A depthwise 1-D convolution that sees only the past: each channel of x (B, C, L) is convolved with
    its own kernel w (C, 1, k) over the last k - 1 values before it (past_state, zeros by default)
    and itself. Returns the output and the last k - 1 values of the padded sequence (the next state)."""
    B, C, L = x.shape
    k = w.shape[-1]
    past = np.zeros((B, C, k - 1), x.dtype) if past_state is None else past_state
    padded = np.concatenate([past, x], axis=2)                                   # (B, C, k - 1 + L)
    work = np.float32 if x.dtype == np.float16 else x.dtype                      # float16 sums in float32
    y = sum(w[None, :, 0, j, None].astype(work) * padded[:, :, j:j + L] for j in range(k))
    if b is not None:
        y = y + b[None, :, None].astype(work)
    if activation in ("silu", "swish"):
        y = y / (1 + np.exp(-y))
    return y.astype(x.dtype), padded[:, :, padded.shape[2] - (k - 1):].astype(x.dtype)
