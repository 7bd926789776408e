"""torch.autograd.Function wrappers: our own forward and backward, plugged into PyTorch's autograd.

A Function is two static methods. `forward(ctx, *inputs)` computes the output and saves
on `ctx` what the backward will need; `backward(ctx, *grad_outputs)` returns one gradient
per input of forward, in the same order (None for inputs that need none, like `stride`).
The conv Functions take stride, padding and dilation as ints or (h, w) pairs, like F.conv2d.

The Numba kernels want numpy arrays. `t.detach().numpy()` is a zero-copy view of a CPU
tensor's memory: `.detach()` is needed because numpy cannot record autograd history
(`.numpy()` refuses a tensor that requires grad). Outputs are allocated with torch and
written through their own `.numpy()` view, so no data is ever copied across.
"""

import torch

from course_lib.custom_ops import conv, pool
from course_lib.custom_ops import numba_kernels as nk


def as_numpy(t):
    """A zero-copy numpy view of a CPU tensor (made contiguous first if it is not)."""
    return t.detach().contiguous().numpy()


class BiasReLU(torch.autograd.Function):
    """y = relu(x + b), b broadcast over channel dim 1, fused in one Numba kernel."""

    @staticmethod
    def forward(ctx, x, b):
        x = x.contiguous()
        y = torch.empty_like(x)
        N, C = x.shape[:2]
        nk.bias_relu_forward(as_numpy(x).reshape(N, C, -1), as_numpy(b), y.numpy().reshape(N, C, -1))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        N, C = y.shape[:2]
        dx = torch.empty_like(y)
        nk.bias_relu_backward(as_numpy(dy).reshape(N, C, -1), y.numpy().reshape(N, C, -1), dx.numpy().reshape(N, C, -1))
        db = dx.sum(dim=[d for d in range(dx.dim()) if d != 1])       # b touched every (n, ...) of its channel
        return dx, db


class Conv2dIm2col(torch.autograd.Function):
    """Conv2d forward and backward through im2col, col2im and matmuls (course_lib.custom_ops.conv)."""

    @staticmethod
    def forward(ctx, x, w, b, stride=1, padding=0, dilation=1):
        ctx.save_for_backward(x, w)
        ctx.conf = conv._pairs(stride, padding, dilation)
        return conv.conv2d_im2col(x, w, b, *ctx.conf)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx, dw, db = conv.conv2d_backward(dy, x, w, *ctx.conf)
        return dx, dw, db, None, None, None


class Conv2dNumba(torch.autograd.Function):
    """Conv2d with the direct Numba kernels in forward and backward."""

    @staticmethod
    def forward(ctx, x, w, b, stride=1, padding=0, dilation=1):
        N = x.shape[0]
        O, _, KH, KW = w.shape
        stride, padding, dilation, (OH, OW) = conv._geometry(x.shape, KH, KW, stride, padding, dilation)
        y = x.new_empty(N, O, OH, OW)
        nk.conv2d_forward(as_numpy(x), as_numpy(w), y.numpy(), stride, padding, dilation)
        ctx.save_for_backward(x, w)
        ctx.conf = (stride, padding, dilation)
        return y + b.view(1, O, 1, 1)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        g = as_numpy(dy)
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        nk.conv2d_backward_input(g, as_numpy(w), dx.numpy(), *ctx.conf)
        nk.conv2d_backward_weight(g, as_numpy(x), dw.numpy(), *ctx.conf)
        return dx, dw, dy.sum(dim=(0, 2, 3)), None, None, None


class MaxPool2d(torch.autograd.Function):
    """Max pooling in torch tensor code (course_lib.custom_ops.pool)."""

    @staticmethod
    def forward(ctx, x, k, stride=None, padding=0, dilation=1):
        y, which = pool.max_pool2d_forward(x, k, stride, padding, dilation)
        ctx.save_for_backward(which)
        ctx.conf = (x.shape, k, stride, padding, dilation)
        return y

    @staticmethod
    def backward(ctx, dy):
        (which,) = ctx.saved_tensors
        return pool.max_pool2d_backward(dy, which, *ctx.conf), None, None, None, None


class MaxPool2dNumba(torch.autograd.Function):
    """Max pooling with the Numba kernels; the forward remembers each window's winner."""

    @staticmethod
    def forward(ctx, x, k, stride=None, padding=0, dilation=1):
        stride = k if stride is None else stride
        N, C, H, W = x.shape
        OH, OW = conv.out_size(H, k, stride, padding, dilation), conv.out_size(W, k, stride, padding, dilation)
        y = x.new_empty(N, C, OH, OW)
        argmax = torch.empty(N, C, OH, OW, dtype=torch.int64)
        nk.max_pool2d_forward(as_numpy(x), y.numpy(), argmax.numpy(), k, stride, padding, dilation)
        ctx.save_for_backward(argmax)
        ctx.x_shape = x.shape
        return y

    @staticmethod
    def backward(ctx, dy):
        (argmax,) = ctx.saved_tensors
        dx = dy.new_empty(ctx.x_shape)
        nk.max_pool2d_backward(as_numpy(dy), argmax.numpy(), dx.numpy())
        return dx, None, None, None, None


def bias_relu(x, b):
    return BiasReLU.apply(x, b)


def conv2d_im2col(x, w, b, stride=1, padding=0, dilation=1):
    return Conv2dIm2col.apply(x, w, b, stride, padding, dilation)


def conv2d_numba(x, w, b, stride=1, padding=0, dilation=1):
    return Conv2dNumba.apply(x, w, b, stride, padding, dilation)


def max_pool2d(x, k, stride=None, padding=0, dilation=1):
    return MaxPool2d.apply(x, k, stride, padding, dilation)


def max_pool2d_numba(x, k, stride=None, padding=0, dilation=1):
    return MaxPool2dNumba.apply(x, k, stride, padding, dilation)
