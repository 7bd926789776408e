"""The chapter's CPU kernels, in Numba. They work on numpy arrays and write into `out`.

Each kernel is compiled on its first call for the dtypes it sees (float32 and float64 make
two compilations), and cached on disk (`cache=True`) so a later process loads it at once.
The autograd wrappers in `functions.py` hand them zero-copy `.numpy()` views of tensors.

Shapes: x (N, C, H, W), w (O, C, KH, KW), out (N, O, OH, OW). The conv kernels take stride,
padding and dilation as (h, w) pairs; the wrappers turn an int into a pair first.
"""

import numba
import numpy as np

# ---- fused bias + ReLU ----------------------------------------------------------------------


@numba.njit(cache=True)
def bias_relu_forward(x, b, y):
    """y = max(x + b[c], 0) for x of shape (N, C, L) (any trailing dims flattened into L)."""
    N, C, L = x.shape
    for n in range(N):
        for c in range(C):
            for i in range(L):
                v = x[n, c, i] + b[c]
                y[n, c, i] = v if v > 0 else 0.0


@numba.njit(cache=True)
def bias_relu_backward(dy, y, dx):
    """dx = dy where the output was positive: the ReLU passes the gradient only there."""
    N, C, L = y.shape
    for n in range(N):
        for c in range(C):
            for i in range(L):
                dx[n, c, i] = dy[n, c, i] if y[n, c, i] > 0 else 0.0


# ---- convolution (cross-correlation, as in every deep learning framework) -------------------
#
# The loops are ordered so that the innermost one runs along an output row (j): for a stride of 1
# it reads x and writes out at stride 1, which the compiler turns into SIMD instructions (the
# kernels spell that case out, on row slices walked from 0: a stride known only at run time, or
# an index that might be negative (Numba then adds a wrap-around test), keeps the loop scalar). The
# padding is handled by `cols`, which gives the range of j whose tap lands inside the image, once
# per row instead of a test per element. (sh, sw), (ph, pw), (dh, dw) are the stride, padding and
# dilation along the rows (h) and along the columns (w).


@numba.njit(inline="always")
def cols(OW, W, stride, padding, dilation, q):
    """The j in [lo, hi) for which column v = j*stride - padding + q*dilation lies in [0, W)."""
    first = padding - q * dilation                      # v >= 0  <=>  j*stride >= first
    lo = max(0, -((-first) // stride))                  # ceil(first / stride)
    hi = min(OW, (W - 1 + first) // stride + 1)         # v <= W - 1
    return lo, max(lo, hi)


@numba.njit(parallel=True, cache=True)
def conv2d_forward(x, w, out, stride, padding, dilation):
    """out[n, o, i, j] = sum_{c, p, q} w[o, c, p, q] * x[n, c, i*sh - ph + p*dh, j*sw - pw + q*dw]."""
    N, C, H, W = x.shape
    O, _, KH, KW = w.shape
    _, _, OH, OW = out.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    for no in numba.prange(N * O):                      # one (sample, out channel) per task
        n, o = no // O, no % O
        out[n, o] = 0.0
        for c in range(C):
            for p in range(KH):
                for q in range(KW):
                    wv = w[o, c, p, q]
                    lo, hi = cols(OW, W, sw, pw, dw, q)
                    shift = q * dw - pw
                    for i in range(OH):
                        h = i * sh - ph + p * dh
                        if 0 <= h < H and sw == 1:  # (a row of the padding adds 0)
                            o_row, x_row = out[n, o, i, lo:hi], x[n, c, h, lo + shift:hi + shift]
                            for j in range(hi - lo):    # from 0, unit stride: SIMD
                                o_row[j] += wv * x_row[j]
                        elif 0 <= h < H:
                            for j in range(lo, hi):
                                out[n, o, i, j] += wv * x[n, c, h, j * sw + shift]


@numba.njit(parallel=True, cache=True)
def conv2d_backward_input(dy, w, dx, stride, padding, dilation):
    """dx[n, c, h, v] = sum over the outputs (i, j) whose window touched (h, v) of dy * w.

    Each task owns one (n, c) plane of dx and scatters into it, so no two threads write the same place.
    """
    N, C, H, W = dx.shape
    O, _, KH, KW = w.shape
    _, _, OH, OW = dy.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    for nc in numba.prange(N * C):
        n, c = nc // C, nc % C
        dx[n, c] = 0.0
        for o in range(O):
            for p in range(KH):
                for q in range(KW):
                    wv = w[o, c, p, q]
                    lo, hi = cols(OW, W, sw, pw, dw, q)
                    shift = q * dw - pw
                    for i in range(OH):
                        h = i * sh - ph + p * dh
                        if 0 <= h < H and sw == 1:
                            dx_row, dy_row = dx[n, c, h, lo + shift:hi + shift], dy[n, o, i, lo:hi]
                            for j in range(hi - lo):
                                dx_row[j] += dy_row[j] * wv
                        elif 0 <= h < H:
                            for j in range(lo, hi):
                                dx[n, c, h, j * sw + shift] += dy[n, o, i, j] * wv


@numba.njit(parallel=True, fastmath={"reassoc", "contract"}, cache=True)
def conv2d_backward_weight(dy, x, dweight, stride, padding, dilation):
    """dweight[o, c, p, q] = sum over n, i, j of dy[n, o, i, j] * x[n, c, i*sh - ph + p*dh, j*sw - pw + q*dw].

    fastmath's reassociation lets the compiler split the sum over j into SIMD lanes.
    """
    N, C, H, W = x.shape
    O, _, KH, KW = dweight.shape
    _, _, OH, OW = dy.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    for oc in numba.prange(O * C):
        o, c = oc // C, oc % C
        for p in range(KH):
            for q in range(KW):
                lo, hi = cols(OW, W, sw, pw, dw, q)
                shift = q * dw - pw
                acc = 0.0
                for n in range(N):                          # summed over the batch
                    for i in range(OH):
                        h = i * sh - ph + p * dh
                        if 0 <= h < H and sw == 1:
                            dy_row, x_row = dy[n, o, i, lo:hi], x[n, c, h, lo + shift:hi + shift]
                            for j in range(hi - lo):
                                acc += dy_row[j] * x_row[j]
                        elif 0 <= h < H:
                            for j in range(lo, hi):
                                acc += dy[n, o, i, j] * x[n, c, h, j * sw + shift]
                dweight[o, c, p, q] = acc


# ---- max pooling (cheap next to the conv, so single-threaded) -----------------------------


@numba.njit(cache=True)
def max_pool2d_forward(x, out, argmax, k, stride, padding, dilation):
    """out = the max over each window (padding counts as -inf); argmax = its flat index h*W + v."""
    N, C, H, W = x.shape
    _, _, OH, OW = out.shape
    for n in range(N):
        for c in range(C):
            for i in range(OH):
                for j in range(OW):
                    best, where = -np.inf, -1
                    for p in range(k):
                        h = i * stride - padding + p * dilation
                        if h < 0 or h >= H:
                            continue
                        for q in range(k):
                            v = j * stride - padding + q * dilation
                            if 0 <= v < W and x[n, c, h, v] > best:
                                best, where = x[n, c, h, v], h * W + v
                    out[n, c, i, j] = best
                    argmax[n, c, i, j] = where


@numba.njit(cache=True)
def max_pool2d_backward(dy, argmax, dx):
    """Each output's gradient goes back to the one input that won its window (added up where windows overlap)."""
    N, C, H, W = dx.shape
    _, _, OH, OW = dy.shape
    dx[:] = 0.0
    for n in range(N):
        for c in range(C):
            for i in range(OH):
                for j in range(OW):
                    a = argmax[n, c, i, j]
                    dx[n, c, a // W, a % W] += dy[n, c, i, j]
