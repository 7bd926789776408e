"""Conv2d through im2col: the whole layer as one matmul, and its backward as two more plus col2im.

    cols = im2col(x)            (N, C*KH*KW, OH*OW)
    y    = w.view(O, -1) @ cols (N, O, OH*OW)            + b
    dw   = sum_n dy[n] @ cols[n].T     (summed over the batch)
    db   = dy summed over n, i, j
    dx   = col2im(w.view(O, -1).T @ dy)    (each window's gradient added back where it came from)

These are the course's answers to exercises 08.3 to 08.6: read them once your checks pass.
"""

import torch

from course_lib.custom_ops.geometry import _geometry, _tap


def im2col(x, kh, kw, stride=1, padding=0, dilation=1):
    """The course's answer to exercise 08.3 (`im2col`): read it once your check passes.

    Every (C, kh, kw) window of x as a column: (N, C*kh*kw, OH*OW), the layout of F.unfold."""
    N, C, H, W = x.shape
    s, p, d, (OH, OW) = _geometry(x.shape, kh, kw, stride, padding, dilation)
    xp = torch.nn.functional.pad(x, (p[1], p[1], p[0], p[0]))
    cols = x.new_empty(N, C, kh, kw, OH, OW)
    for a in range(kh):
        for c in range(kw):
            cols[:, :, a, c] = xp[_tap(a, c, OH, OW, s, d)]
    return cols.reshape(N, C * kh * kw, OH * OW)


def col2im(cols, x_shape, kh, kw, stride=1, padding=0, dilation=1):
    """The course's answer to exercise 08.6 (`conv2d_input_grad`): read it once your check passes.

    The adjoint of im2col: add each column entry back to the input pixel it was copied from."""
    N, C, H, W = x_shape
    s, p, d, (OH, OW) = _geometry(x_shape, kh, kw, stride, padding, dilation)
    cols = cols.reshape(N, C, kh, kw, OH, OW)
    xp = cols.new_zeros(N, C, H + 2 * p[0], W + 2 * p[1])
    for a in range(kh):
        for c in range(kw):
            xp[_tap(a, c, OH, OW, s, d)] += cols[:, :, a, c]
    return xp[:, :, p[0]: p[0] + H, p[1]: p[1] + W]


def conv2d_im2col(x, w, b=None, stride=1, padding=0, dilation=1):
    """The course's answer to exercise 08.4 (`conv2d_forward`): read it once your check passes.

    Forward: one matmul of the flattened kernels with the columns."""
    N = x.shape[0]
    O, _, KH, KW = w.shape
    *_, (OH, OW) = _geometry(x.shape, KH, KW, stride, padding, dilation)
    cols = im2col(x, KH, KW, stride, padding, dilation)
    y = (w.reshape(O, -1) @ cols).reshape(N, O, OH, OW)
    return y if b is None else y + b.view(1, O, 1, 1)


def conv2d_weight_grad(x, dy, w_shape, stride=1, padding=0, dilation=1):
    """The course's answer to exercise 08.5 (`conv2d_weight_grad`): read it once your check passes.

    dL/dw = sum over the batch of dy[n] @ cols[n].T."""
    O, C, KH, KW = w_shape
    cols = im2col(x, KH, KW, stride, padding, dilation)              # (N, C*KH*KW, L)
    return torch.einsum("nol,nkl->ok", dy.reshape(dy.shape[0], O, -1), cols).reshape(w_shape)


def conv2d_input_grad(dy, w, x_shape, stride=1, padding=0, dilation=1):
    """The course's answer to exercise 08.6 (`conv2d_input_grad`): read it once your check passes.

    dL/dx = col2im(w^T @ dy): every window sends its share of the gradient home."""
    O, C, KH, KW = w.shape
    dcols = w.reshape(O, -1).t() @ dy.reshape(dy.shape[0], O, -1)     # (N, C*KH*KW, L)
    return col2im(dcols, x_shape, KH, KW, stride, padding, dilation)


def conv2d_backward(dy, x, w, stride=1, padding=0, dilation=1):
    """(dx, dw, db) of conv2d for the output gradient dy."""
    return (conv2d_input_grad(dy, w, x.shape, stride, padding, dilation),
            conv2d_weight_grad(x, dy, w.shape, stride, padding, dilation),
            dy.sum(dim=(0, 2, 3)))
