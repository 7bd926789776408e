"""The geometry of a 2-D convolution: how many windows fit, and where each kernel offset reads.

As in F.conv2d, each of stride, padding and dilation is an int (the same on both axes) or an
(h, w) pair; `_pair` turns either into a pair once, at the top of each function.
"""


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
