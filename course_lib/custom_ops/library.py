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

The fused bias + ReLU op, `course::bias_relu`, is the course's answer to exercise 08.2 and lives in
bias_relu_op.py (read it once your check passes); this file registers conv2d.

conv2d's stride, padding and dilation are ints or (h, w) pairs, as in F.conv2d. Python type hints
cannot say "an int or a pair" to the schema inference, so conv2d spells its schema out: `int[2]`
takes either and hands the implementation a list of two.
"""

import torch

from course_lib.custom_ops import conv
from course_lib.custom_ops import numba_kernels as nk
from course_lib.custom_ops.bias_relu_op import bias_relu, bias_relu_backward  # noqa: F401  (course::bias_relu)
from course_lib.custom_ops.functions import as_numpy

# ---- conv2d with the Numba kernels ----------------------------------------------------------


CONV_ARGS = "int[2] stride=1, int[2] padding=0, int[2] dilation=1"


@torch.library.custom_op("course::conv2d", mutates_args=(),
                         schema=f"(Tensor x, Tensor w, Tensor b, {CONV_ARGS}) -> Tensor")
def conv2d(x, w, b, stride=1, padding=0, dilation=1):
    """Conv2d (cross-correlation) with the direct Numba kernel, plus the bias."""
    y = _conv2d_empty(x, w, stride, padding, dilation)
    nk.conv2d_forward(as_numpy(x), as_numpy(w), y.numpy(), *conv._pairs(stride, padding, dilation))
    return y + b.view(1, -1, 1, 1)


def _conv2d_empty(x, w, stride, padding, dilation):
    O, _, KH, KW = w.shape
    *_, (OH, OW) = conv._geometry(x.shape, KH, KW, stride, padding, dilation)
    return x.new_empty(x.shape[0], O, OH, OW)


@conv2d.register_fake
def _(x, w, b, stride=1, padding=0, dilation=1):
    return _conv2d_empty(x, w, stride, padding, dilation)


@torch.library.custom_op("course::conv2d_grad", mutates_args=(),
                         schema=f"(Tensor dy, Tensor x, Tensor w, {CONV_ARGS}) -> (Tensor, Tensor)")
def conv2d_grad(dy, x, w, stride=1, padding=0, dilation=1):
    """(dx, dw) with the Numba backward kernels."""
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    dw = torch.empty_like(w, memory_format=torch.contiguous_format)
    g, conf = as_numpy(dy), conv._pairs(stride, padding, dilation)
    nk.conv2d_backward_input(g, as_numpy(w), dx.numpy(), *conf)
    nk.conv2d_backward_weight(g, as_numpy(x), dw.numpy(), *conf)
    return dx, dw


@conv2d_grad.register_fake
def _(dy, x, w, stride=1, padding=0, dilation=1):
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
