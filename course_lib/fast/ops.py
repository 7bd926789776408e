"""Parallel strided map, zip, reduce and where kernels: any view, permuted, sliced or broadcast.

The scalar ops are tensor/scalar_ops.py's plain functions, compiled here for the CPU. One
compiled kernel serves every op: the op arrives as its code (`scalar_ops.MAP_CODE[name]`) and
`unary` / `binary` / `fold` branch on it (switch.py). The branch is the same for every element,
so the CPU predicts it perfectly, and we compile 3 kernels per dtype instead of one per op
(compiling a parallel kernel costs about 2 s).

Contiguous operands take the faster kernels of flat.py instead.

Each general kernel splits its output into blocks of up to BLOCK elements along the last dim and
runs the blocks in parallel with `prange`. Within a block, every operand advances by its
own last-dim stride, so permuted, sliced and broadcast (stride 0) views need no copy.
`error_model="numpy"` makes 1/0 give inf (as numpy does) instead of raising.
"""

import numpy as np
from numba import njit, prange

from course_lib.fast.indexing import position
from course_lib.fast.switch import JIT, switch
from course_lib.tensor import scalar_ops

BLOCK = 2048

unary = switch(scalar_ops.MAP, "x")      # unary(code, x) = the map op of that code, applied to x
binary = switch(scalar_ops.ZIP, "x, y")  # binary(code, x, y); comparisons give 1.0 or 0.0
fold = switch({name: scalar_ops.ZIP[op] for name, (op, _) in scalar_ops.REDUCE.items()}, "acc, x")
START = np.array([start for _, start in scalar_ops.REDUCE.values()])  # fold(code, acc, x) from acc = START[code]


@njit(parallel=True, **JIT)
def map_kernel(op, out, out_offset, shape, out_strides, a, a_offset, a_strides):
    """The course's answer to exercise 06.9 (`strided_copy`): read it once your check passes.

    out[i] = unary(op, a[i]) over `shape`; a's strides are already broadcast to it. Each parallel
    iteration takes a block of up to BLOCK elements of one row: two positions for the block, then steps
    of each view's last stride (a copy is the identity op)."""
    n = shape[-1]
    size = 1
    for s in shape:
        size *= s
    per_row = (n + BLOCK - 1) // BLOCK
    so, sa = out_strides[-1], a_strides[-1]
    for blk in prange((size // n) * per_row):
        start = (blk // per_row) * n + (blk % per_row) * BLOCK
        po = position(start, shape, out_strides, out_offset)
        pa = position(start, shape, a_strides, a_offset)
        for j in range(min(BLOCK, n - (blk % per_row) * BLOCK)):
            out[po + j * so] = unary(op, a[pa + j * sa])


@njit(parallel=True, **JIT)
def zip_kernel(op, out, out_offset, shape, out_strides, a, a_offset, a_strides, b, b_offset, b_strides):
    """out[i] = binary(op, a[i], b[i]) over `shape`; a's and b's strides are broadcast to it."""
    n = shape[-1]
    size = 1
    for s in shape:
        size *= s
    per_row = (n + BLOCK - 1) // BLOCK
    so, sa, sb = out_strides[-1], a_strides[-1], b_strides[-1]
    for blk in prange((size // n) * per_row):
        start = (blk // per_row) * n + (blk % per_row) * BLOCK
        po = position(start, shape, out_strides, out_offset)
        pa = position(start, shape, a_strides, a_offset)
        pb = position(start, shape, b_strides, b_offset)
        for j in range(min(BLOCK, n - (blk % per_row) * BLOCK)):
            out[po + j * so] = binary(op, a[pa + j * sa], b[pb + j * sb])


@njit(parallel=True, **JIT)
def reduce_kernel(op, out, out_shape, a, a_offset, a_strides, dim, n):
    """The course's answer to exercise 06.5 (`sum_dim`): read it once your check passes.

    Reduce dim `dim` (of length n) of a into the contiguous `out` of `out_shape` (keepdim).

    Each parallel iteration owns a block of up to BLOCK outputs that are neighbours along the
    last dim, with one private accumulator per output: no two threads ever write the same
    element, so there is no race. The loop over the reduced dim is outside the loop over the
    block, so when a's last dim is contiguous the inner loop reads memory at stride 1 (summing
    the columns of a matrix reads it row by row). Sums accumulate in float64.
    """
    m = out_shape[-1]
    step, last = a_strides[dim], a_strides[-1]
    per_row = (m + BLOCK - 1) // BLOCK
    for blk in prange((out.size // m) * per_row):
        first = (blk // per_row) * m + (blk % per_row) * BLOCK
        width = min(BLOCK, m - (blk % per_row) * BLOCK)
        start = position(first, out_shape, a_strides, a_offset)  # index 0 along dim
        acc = np.full(width, START[op])
        for k in range(n):
            base = start + k * step
            for j in range(width):
                acc[j] = fold(op, acc[j], a[base + j * last])
        for j in range(width):
            out[first + j] = acc[j]


@njit(parallel=True, **JIT)
def where_kernel(out, shape, c, c_offset, c_strides, a, a_offset, a_strides, b, b_offset, b_strides):
    """out[i] = a[i] if c[i] != 0 else b[i], into the contiguous `out`; inputs broadcast to shape.

    Blocks along the last dim as in zip_kernel: three positions per block, then steps."""
    n = shape[-1]
    per_row = (n + BLOCK - 1) // BLOCK
    sc, sa, sb = c_strides[-1], a_strides[-1], b_strides[-1]
    for blk in prange((out.size // n) * per_row):
        start = (blk // per_row) * n + (blk % per_row) * BLOCK
        pc = position(start, shape, c_strides, c_offset)
        pa = position(start, shape, a_strides, a_offset)
        pb = position(start, shape, b_strides, b_offset)
        for j in range(min(BLOCK, n - (blk % per_row) * BLOCK)):
            out[start + j] = a[pa + j * sa] if c[pc + j * sc] != 0 else b[pb + j * sb]
