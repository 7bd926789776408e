"""Ops registered with torch.library.custom_op: first-class citizens of the dispatcher.

An autograd.Function is invisible to torch.compile's tracer only until it calls into
numpy: the tracer cannot look inside a Numba kernel. `custom_op` tells PyTorch exactly
what it needs instead, and the op then works everywhere (autograd, torch.compile, export):

- the implementation (here: Numba kernels on zero-copy views), run on real tensors;
- a fake implementation (`register_fake`): the output's shape, dtype and device from the
  inputs' alone, so the compiler can trace the graph with FakeTensors that hold no data;
- the autograd formula (`register_autograd`): `setup_context` saves what backward needs,
  and `backward` returns one gradient per input, built from ops (here another custom op).

`torch.library.opcheck(op, args)` tests all of that against the real implementation.
"""

import torch

from course_lib.ops import conv, numba_kernels as nk
from course_lib.ops.functions import as_numpy

# ---- fused bias + ReLU ----------------------------------------------------------------------


@torch.library.custom_op("course::bias_relu", mutates_args=())
def bias_relu(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """relu(x + b[None, :, None, ...]) with the Numba kernel."""
    N, C = x.shape[:2]
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    nk.bias_relu_forward(as_numpy(x).reshape(N, C, -1), as_numpy(b), y.numpy().reshape(N, C, -1))
    return y


@bias_relu.register_fake
def _(x, b):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("course::bias_relu_backward", mutates_args=())
def bias_relu_backward(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    N, C = y.shape[:2]
    dx = torch.empty_like(y, memory_format=torch.contiguous_format)
    nk.bias_relu_backward(as_numpy(dy).reshape(N, C, -1), as_numpy(y).reshape(N, C, -1), dx.numpy().reshape(N, C, -1))
    return dx


@bias_relu_backward.register_fake
def _(dy, y):
    return torch.empty_like(y, memory_format=torch.contiguous_format)


def _bias_relu_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _bias_relu_grad(ctx, dy):
    (y,) = ctx.saved_tensors
    dx = bias_relu_backward(dy, y)
    return dx, dx.sum(dim=[d for d in range(dx.dim()) if d != 1])


bias_relu.register_autograd(_bias_relu_grad, setup_context=_bias_relu_setup)

# ---- conv2d with the Numba kernels ----------------------------------------------------------


@torch.library.custom_op("course::conv2d", mutates_args=())
def conv2d(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
           stride: int = 1, padding: int = 0, dilation: int = 1) -> torch.Tensor:
    """Conv2d (cross-correlation) with the direct Numba kernel, plus the bias."""
    y = _conv2d_empty(x, w, stride, padding, dilation)
    nk.conv2d_forward(as_numpy(x), as_numpy(w), y.numpy(), stride, padding, dilation)
    return y + b.view(1, -1, 1, 1)


def _conv2d_empty(x, w, stride, padding, dilation):
    N, _, H, W = x.shape
    O, _, KH, KW = w.shape
    return x.new_empty(N, O, conv.out_size(H, KH, stride, padding, dilation),
                       conv.out_size(W, KW, stride, padding, dilation))


@conv2d.register_fake
def _(x, w, b, stride=1, padding=0, dilation=1):
    return _conv2d_empty(x, w, stride, padding, dilation)


@torch.library.custom_op("course::conv2d_grad", mutates_args=())
def conv2d_grad(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                stride: int, padding: int, dilation: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) with the Numba backward kernels."""
    dx, dw = torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(w, memory_format=torch.contiguous_format)
    g = as_numpy(dy)
    nk.conv2d_backward_input(g, as_numpy(w), dx.numpy(), stride, padding, dilation)
    nk.conv2d_backward_weight(g, as_numpy(x), dw.numpy(), stride, padding, dilation)
    return dx, dw


@conv2d_grad.register_fake
def _(dy, x, w, stride, padding, dilation):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(w, memory_format=torch.contiguous_format))


def _conv2d_setup(ctx, inputs, output):
    x, w, b, stride, padding, dilation = inputs
    ctx.save_for_backward(x, w)
    ctx.conf = (stride, padding, dilation)


def _conv2d_backward(ctx, dy):
    x, w = ctx.saved_tensors
    dx, dw = conv2d_grad(dy, x, w, *ctx.conf)
    return dx, dw, dy.sum(dim=(0, 2, 3)), None, None, None


conv2d.register_autograd(_conv2d_backward, setup_context=_conv2d_setup)
