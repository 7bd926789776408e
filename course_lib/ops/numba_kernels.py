"""The chapter's CPU kernels, in Numba. They work on numpy arrays and write into `out`.

Each kernel is compiled on its first call for the dtypes it sees (float32 and float64 make
two compilations), and cached on disk (`cache=True`) so a later process loads it at once.
The autograd wrappers in `functions.py` hand them zero-copy `.numpy()` views of tensors.

Shapes: x (N, C, H, W), w (O, C, KH, KW), out (N, O, OH, OW).
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


@numba.njit(parallel=True, cache=True)
def conv2d_forward(x, w, out, stride, padding, dilation):
    """out[n, o, i, j] = sum_{c, p, q} w[o, c, p, q] * x[n, c, i*s - pad + p*d, j*s - pad + q*d]."""
    N, C, H, W = x.shape
    O, _, KH, KW = w.shape
    _, _, OH, OW = out.shape
    for no in numba.prange(N * O):                      # one (sample, out channel) per task
        n, o = no // O, no % O
        for i in range(OH):
            for j in range(OW):
                acc = 0.0
                for c in range(C):
                    for p in range(KH):
                        h = i * stride - padding + p * dilation
                        if h < 0 or h >= H:
                            continue                      # a zero of the padding
                        for q in range(KW):
                            v = j * stride - padding + q * dilation
                            if 0 <= v < W:
                                acc += w[o, c, p, q] * x[n, c, h, v]
                out[n, o, i, j] = acc


@numba.njit(parallel=True, cache=True)
def conv2d_backward_input(dy, w, dx, stride, padding, dilation):
    """dx[n, c, h, v] = sum over the outputs (i, j) whose window touched (h, v) of dy * w.

    Each task owns one (n, c) plane of dx and scatters into it, so no two threads write the same place.
    """
    N, C, H, W = dx.shape
    O, _, KH, KW = w.shape
    _, _, OH, OW = dy.shape
    for nc in numba.prange(N * C):
        n, c = nc // C, nc % C
        dx[n, c, :, :] = 0.0
        for o in range(O):
            for i in range(OH):
                for j in range(OW):
                    g = dy[n, o, i, j]
                    for p in range(KH):
                        h = i * stride - padding + p * dilation
                        if h < 0 or h >= H:
                            continue
                        for q in range(KW):
                            v = j * stride - padding + q * dilation
                            if 0 <= v < W:
                                dx[n, c, h, v] += g * w[o, c, p, q]


@numba.njit(parallel=True, cache=True)
def conv2d_backward_weight(dy, x, dw, stride, padding, dilation):
    """dw[o, c, p, q] = sum over n, i, j of dy[n, o, i, j] * x[n, c, i*s - pad + p*d, j*s - pad + q*d]."""
    N, C, H, W = x.shape
    O, _, KH, KW = dw.shape
    _, _, OH, OW = dy.shape
    for oc in numba.prange(O * C):
        o, c = oc // C, oc % C
        for p in range(KH):
            for q in range(KW):
                acc = 0.0
                for n in range(N):                          # summed over the batch
                    for i in range(OH):
                        h = i * stride - padding + p * dilation
                        if h < 0 or h >= H:
                            continue
                        for j in range(OW):
                            v = j * stride - padding + q * dilation
                            if 0 <= v < W:
                                acc += dy[n, o, i, j] * x[n, c, h, v]
                dw[o, c, p, q] = acc


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
