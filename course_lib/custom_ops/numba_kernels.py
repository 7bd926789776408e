"""The chapter's CPU kernels, in Numba. They work on numpy arrays and write into `out`.

Each kernel is compiled on its first call for the dtypes it sees (float32 and float64 make
two compilations), and cached on disk (`cache=True`) so a later process loads it at once.
The autograd wrappers in `functions.py` hand them zero-copy `.numpy()` views of tensors.

Shapes: x (N, C, H, W), w (O, C, KH, KW), out (N, O, OH, OW). The conv kernels, in numba_conv.py,
take stride, padding and dilation as (h, w) pairs; the wrappers turn an int into a pair first. Their
forward is the course's answer to exercise 08.7: read it once your check passes.
"""

import numba
import numpy as np

from course_lib.custom_ops.numba_conv import (  # noqa: F401  (the conv kernels, importable from here too)
    conv2d_backward_input,
    conv2d_backward_weight,
    conv2d_forward,
)

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
