"""Conv2d from scratch, in plain torch tensor code: a loop reference, and im2col + matmul.

Deep learning "convolution" is a cross-correlation: the kernel slides over the input
without being flipped. With stride s, padding p and dilation d, output pixel (i, j) sees
the input pixels (i*s - p + a*d, j*s - p + b*d) for kernel offsets (a, b):

    y[n, o, i, j] = b[o] + sum_{c, a, b} w[o, c, a, b] * x_pad[n, c, i*s + a*d, j*s + b*d]

As in F.conv2d, each of stride, padding and dilation is an int (the same on both axes) or an
(h, w) pair; `_pair` turns either into a pair once, at the top of each function.

im2col copies every window into a column, so the whole layer becomes one matmul:

    cols = im2col(x)            (N, C*KH*KW, OH*OW)
    y    = w.view(O, -1) @ cols (N, O, OH*OW)            + b

and its backward is two more matmuls plus col2im, the adjoint of im2col:

    dw   = sum_n dy[n] @ cols[n].T     (summed over the batch)
    db   = dy summed over n, i, j
    dx   = col2im(w.view(O, -1).T @ dy)    (each window's gradient added back where it came from)
"""

import torch


def out_size(n, k, stride=1, padding=0, dilation=1):
    """How many window positions fit along one axis of length n."""
    return (n + 2 * padding - dilation * (k - 1) - 1) // stride + 1


def _pair(v):
    """An int or an (h, w) pair, as an (h, w) tuple."""
    h, w = (v, v) if isinstance(v, int) else v
    return h, w


def _pairs(stride, padding, dilation):
    """stride, padding and dilation, each an int or a pair, as three (h, w) pairs."""
    return _pair(stride), _pair(padding), _pair(dilation)


def _geometry(x_shape, kh, kw, stride, padding, dilation):
    """(stride, padding, dilation) as pairs, and the output size (OH, OW)."""
    s, p, d = _pairs(stride, padding, dilation)
    H, W = x_shape[-2:]
    return s, p, d, (out_size(H, kh, s[0], p[0], d[0]), out_size(W, kw, s[1], p[1], d[1]))


def _tap(a, c, OH, OW, s, d):
    """The index of the padded input that kernel offset (a, c) reads for every output pixel."""
    return (slice(None), slice(None), slice(a * d[0], a * d[0] + s[0] * (OH - 1) + 1, s[0]),
            slice(c * d[1], c * d[1] + s[1] * (OW - 1) + 1, s[1]))


def conv2d_loops(x, w, b=None, stride=1, padding=0, dilation=1):
    """The reference: loop over the kernel offsets, each a strided slice of the padded input."""
    N, C, H, W = x.shape
    O, _, KH, KW = w.shape
    s, p, d, (OH, OW) = _geometry(x.shape, KH, KW, stride, padding, dilation)
    xp = torch.nn.functional.pad(x, (p[1], p[1], p[0], p[0]))
    y = x.new_zeros(N, O, OH, OW)
    for a in range(KH):
        for c in range(KW):
            y += torch.einsum("nchw,oc->nohw", xp[_tap(a, c, OH, OW, s, d)], w[:, :, a, c])
    return y if b is None else y + b.view(1, O, 1, 1)


def im2col(x, kh, kw, stride=1, padding=0, dilation=1):
    """Every (C, kh, kw) window of x as a column: (N, C*kh*kw, OH*OW), the layout of F.unfold."""
    N, C, H, W = x.shape
    s, p, d, (OH, OW) = _geometry(x.shape, kh, kw, stride, padding, dilation)
    xp = torch.nn.functional.pad(x, (p[1], p[1], p[0], p[0]))
    cols = x.new_empty(N, C, kh, kw, OH, OW)
    for a in range(kh):
        for c in range(kw):
            cols[:, :, a, c] = xp[_tap(a, c, OH, OW, s, d)]
    return cols.reshape(N, C * kh * kw, OH * OW)


def col2im(cols, x_shape, kh, kw, stride=1, padding=0, dilation=1):
    """The adjoint of im2col: add each column entry back to the input pixel it was copied from."""
    N, C, H, W = x_shape
    s, p, d, (OH, OW) = _geometry(x_shape, kh, kw, stride, padding, dilation)
    cols = cols.reshape(N, C, kh, kw, OH, OW)
    xp = cols.new_zeros(N, C, H + 2 * p[0], W + 2 * p[1])
    for a in range(kh):
        for c in range(kw):
            xp[_tap(a, c, OH, OW, s, d)] += cols[:, :, a, c]
    return xp[:, :, p[0]: p[0] + H, p[1]: p[1] + W]


def conv2d_im2col(x, w, b=None, stride=1, padding=0, dilation=1):
    """Forward: one matmul of the flattened kernels with the columns."""
    N = x.shape[0]
    O, _, KH, KW = w.shape
    *_, (OH, OW) = _geometry(x.shape, KH, KW, stride, padding, dilation)
    cols = im2col(x, KH, KW, stride, padding, dilation)
    y = (w.reshape(O, -1) @ cols).reshape(N, O, OH, OW)
    return y if b is None else y + b.view(1, O, 1, 1)


def conv2d_weight_grad(x, dy, w_shape, stride=1, padding=0, dilation=1):
    """dL/dw = sum over the batch of dy[n] @ cols[n].T."""
    O, C, KH, KW = w_shape
    cols = im2col(x, KH, KW, stride, padding, dilation)              # (N, C*KH*KW, L)
    return torch.einsum("nol,nkl->ok", dy.reshape(dy.shape[0], O, -1), cols).reshape(w_shape)


def conv2d_input_grad(dy, w, x_shape, stride=1, padding=0, dilation=1):
    """dL/dx = col2im(w^T @ dy): every window sends its share of the gradient home."""
    O, C, KH, KW = w.shape
    dcols = w.reshape(O, -1).t() @ dy.reshape(dy.shape[0], O, -1)     # (N, C*KH*KW, L)
    return col2im(dcols, x_shape, KH, KW, stride, padding, dilation)


def conv2d_backward(dy, x, w, stride=1, padding=0, dilation=1):
    """(dx, dw, db) of conv2d for the output gradient dy."""
    return (conv2d_input_grad(dy, w, x.shape, stride, padding, dilation),
            conv2d_weight_grad(x, dy, w.shape, stride, padding, dilation),
            dy.sum(dim=(0, 2, 3)))
