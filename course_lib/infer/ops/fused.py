"""Fused kernels that the optimization passes create (domain "course"): one node where there were two."""

import numpy as np

from ..registry import register
from .nn import conv


@register("MatMulAdd", since=1, domain="course")
def matmul_add(a, b, c):
    """MatMul followed by Add, for inputs of any rank (Gemm takes only 2-D ones)."""
    y = np.matmul(a, b)
    y += c  # in place: the product is a fresh buffer
    return y


@register("ConvRelu", since=1, domain="course")
def conv_relu(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
              strides=None):
    """Conv, then Relu in place on the convolution's fresh output buffer."""
    y = conv(x, w, b, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
             strides=strides)
    return np.maximum(y, 0, out=y)
