"""Conv2d from scratch, in plain torch tensor code: a loop reference, and im2col + matmul.

Deep learning "convolution" is a cross-correlation: the kernel slides over the input
without being flipped. With stride s, padding p and dilation d, output pixel (i, j) sees
the input pixels (i*s - p + a*d, j*s - p + b*d) for kernel offsets (a, b):

    y[n, o, i, j] = b[o] + sum_{c, a, b} w[o, c, a, b] * x_pad[n, c, i*s + a*d, j*s + b*d]

The geometry (window counts, and the strided slice each kernel offset reads) is in geometry.py.
im2col copies every window into a column, so the whole layer becomes one matmul; its functions
(im2col, col2im, conv2d_im2col and the two gradients) are the course's answers to exercises 08.3
to 08.6, in im2col.py (read them once your checks pass), and are importable from here too.
"""

import torch

from course_lib.custom_ops.geometry import _geometry, _pair, _pairs, _tap, out_size  # noqa: F401
from course_lib.custom_ops.im2col import (  # noqa: F401  (conv2d_im2col, its backward)
    col2im,
    conv2d_backward,
    conv2d_im2col,
    conv2d_input_grad,
    conv2d_weight_grad,
    im2col,
)


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
