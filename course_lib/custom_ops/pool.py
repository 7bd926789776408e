"""MaxPool2d from scratch in torch tensor code: windows by strided slices, gradient to the winner.

    y[n, c, i, j] = max over (a, b) of x_pad[n, c, i*s + a*d, j*s + b*d]     (padding is -inf)
    dx            = dy routed to the argmax of each window (added up where windows overlap)
"""

import torch

from course_lib.custom_ops.conv import out_size


def _windows(x, k, stride, padding, dilation):
    """All k*k shifted views of the -inf padded input, stacked: (k*k, N, C, OH, OW)."""
    N, C, H, W = x.shape
    OH, OW = out_size(H, k, stride, padding, dilation), out_size(W, k, stride, padding, dilation)
    xp = torch.nn.functional.pad(x, (padding,) * 4, value=float("-inf"))
    return torch.stack([xp[:, :, a * dilation: a * dilation + stride * (OH - 1) + 1: stride,
                              b * dilation: b * dilation + stride * (OW - 1) + 1: stride]
                        for a in range(k) for b in range(k)])


def max_pool2d_forward(x, k, stride=None, padding=0, dilation=1):
    """(y, which) where `which` is the index (a*k + b) of the winning offset of each window."""
    stride = k if stride is None else stride
    y, which = _windows(x, k, stride, padding, dilation).max(dim=0)
    return y, which


def max_pool2d_backward(dy, which, x_shape, k, stride=None, padding=0, dilation=1):
    """Scatter each output's gradient to its window's winner (the same place, added up, when windows overlap)."""
    stride = k if stride is None else stride
    N, C, H, W = x_shape
    OH, OW = dy.shape[2:]
    dxp = dy.new_zeros(N, C, H + 2 * padding, W + 2 * padding)
    for a in range(k):
        for b in range(k):
            dxp[:, :, a * dilation: a * dilation + stride * (OH - 1) + 1: stride,
                      b * dilation: b * dilation + stride * (OW - 1) + 1: stride] += dy * (which == a * k + b)
    return dxp[:, :, padding: padding + H, padding: padding + W]
