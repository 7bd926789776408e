"""Fused kernels that the optimization passes create (domain "course"): one node where there were several.

FusedConv, the convolution with its bias and Relu, is in conv.py beside Conv."""

import functools
import math

import numpy as np

from ..registry import lookup, register
from .linalg import softmax_in_place


@register("MatMulAdd", since=1, domain="course")
def matmul_add(a, b, c, *, out=None):
    """MatMul followed by Add, for inputs of any rank (Gemm takes only 2-D ones). The pass gives it a
    2-D b; `out` is a flat buffer from the session's memory plan (used when it has the right size)."""
    shape = a.shape[:-1] + b.shape[-1:]
    y = np.matmul(a, b, out=out.reshape(shape) if out is not None and out.size == math.prod(shape) else None)
    y += c  # in place: the product is a buffer of our own
    return y


_ZEROS = {}   # dtype -> a read-only flat array of zeros, grown when a bigger one is asked for


def zeros_like(y):
    """A read-only array of zeros with y's shape and dtype, a view of a buffer made once.

    Why: numpy runs np.maximum(y, 0) through a slower loop for the scalar 0 than against a whole array
    of zeros (numpy 2.4, float32: about twice as slow at 4096 values, the MLP's hidden layer at batch 32)."""
    z = _ZEROS.get(y.dtype)
    if z is None or z.size < y.size:
        z = _ZEROS[y.dtype] = np.zeros(max(y.size, 4096), y.dtype)
        z.flags.writeable = False
    return z[:y.size].reshape(y.shape)


@register("FusedGemm", since=1, domain="course")
def fused_gemm(a, b, c=None, *, transB=0, activation="", out=None):
    """a @ b' + c (b' = b transposed when transB is set), then activation="Relu" in place: Gemm with
    alpha = beta = 1 and its Relu. `out` is a flat buffer from the session's memory plan.

    np.dot rather than np.matmul: on 2-D arrays both call the same BLAS routine (the same bits), but
    matmul's more general setup costs about half a microsecond more per call, a fifth of the whole
    product's time at batch 1."""
    b = b.T if transB else b
    n, m = a.shape[0], b.shape[1]
    y = np.dot(a, b, out=out.reshape(n, m)) if out is not None and out.size == n * m else np.dot(a, b)
    if c is not None:
        y += c
    if activation == "Relu":
        np.maximum(y, zeros_like(y), out=y)
    return y


BLOCK = 32768  # elements of x per block in Elementwise: a block's temporaries stay in the L2 cache


@functools.lru_cache(maxsize=None)
def _kernels(ops):
    return [lookup(op, 10**6)[0] for op in ops]  # these ops have one version each: the newest


@register("Elementwise", since=1, domain="course")
def elementwise(x, *consts, ops, args, out=None):
    """Run a region of elementwise ops on one block of x at a time, instead of each op on all of x.

    Op k reads slots args[2k] and args[2k + 1] (-1: none). Slot 0 is the block of x, then come the
    scalar constants, then each op's result. Every op is elementwise, so block by block gives the same
    numbers; the temporaries are block-sized and stay in the cache. The last op's result is the output."""
    shape = np.broadcast_shapes(x.shape, *(c.shape for c in consts))
    flat = np.ascontiguousarray(x).reshape(-1)
    consts = [c.reshape(()) for c in consts]
    steps = list(zip(_kernels(tuple(ops)), args[0::2], args[1::2]))
    result = None
    for start in range(0, max(flat.size, 1), BLOCK):
        slots = [flat[start:start + BLOCK], *consts]
        for fn, a, b in steps:
            slots.append(fn(slots[a]) if b < 0 else fn(slots[a], slots[b]))
        if result is None:   # `out`, a buffer from the session's memory plan, when it fits
            fits = out is not None and out.size == flat.size and out.dtype == slots[-1].dtype
            result = out if fits else np.empty(flat.size, slots[-1].dtype)
        result[start:start + BLOCK] = slots[-1]
    return result.reshape(shape)


@register("MaskedSoftmax", since=1, domain="course")
def masked_softmax(s, mask, fill, scale=None, *, axis=-1, divide=1):
    """Softmax(Where(mask, fill, s / scale)) (s * scale when divide=0; s alone without a scale).

    The scaling makes one fresh buffer; masking and the softmax then work in it, in place."""
    y = s if scale is None else (s / scale if divide else s * scale)
    fits = fill.dtype == y.dtype and mask.dtype == bool and \
        np.broadcast_shapes(mask.shape, fill.shape, y.shape) == y.shape
    if y is s or not fits:
        y = np.where(mask, fill, y)  # a new buffer (of the broadcast shape and promoted type) is needed anyway
    else:
        np.copyto(y, fill, where=mask)  # what Where does, in our own buffer
    return softmax_in_place(y, axis)
