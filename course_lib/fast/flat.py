"""Flat kernels for contiguous operands: the common case, with no strides to follow.

Most elementwise calls in a training loop read contiguous tensors of the output's shape, or
a bias row (shape (m,), added to every row), a column (shape (n, 1): x - x.max(dim=-1)), or
a single number (Adam's learning rate). A strided kernel pays for that generality on every
element: a multiply-add per operand to find its position, and a branch on the op code.

Here the output is read as `rows` x `cols`, and each operand says by its kind how it is read:

    FULL  a[r * cols + j]   same shape as the output
    ROW   a[j]              the output's trailing dims, (m,) or (T, C) in (B, T, C), repeated
    COL   a[r]              one element per row, repeated along it
    ONE   a[0]              one element, read everywhere

`plan` picks the kinds and cols: a ROW's size, the last dim when an operand is a COL, else a
block of BLOCK elements (rows are what the parallel flavour shares among the threads).
`flat_reduce_last` reduces the last dim of a contiguous tensor, a row at a time: the strided
reduce kernel would keep there one accumulator array, of width 1, per output.

`flat_reduce_inner` reduces any other dim of a contiguous tensor.

Each builder (`flat_map`, `flat_zip`, `flat_where`, `flat_reduce_last`, `flat_reduce_inner`) makes one kernel per
op and kinds, which are constants of the kernel: Numba folds the op's switch and the kinds'
branches away. Each row works on slices indexed by the loop counter alone, so Numba knows no
index is negative and drops its wraparound test, and LLVM vectorizes the inner loop (4 to 16
elements per instruction; written `out[base + j]`, the same loop runs about 4 times slower).
A kernel compiles on first use (about 0.2 s; 2 s for the parallel flavour, used above
pool.PARALLEL_MIN elements when Numba has more than one thread) and is cached on disk.

The two flavours loop with `loop = prange if parallel else range`, not with prange in both:
Numba's disk cache tells kernels apart by their code and the values they capture, not by
the `parallel` flag, so two flavours of the same code would load each other's machine code.
"""

import functools
import math

import numpy as np
from numba import njit, prange

from course_lib.fast.ops import START, binary, fold, unary
from course_lib.fast.switch import JIT

FULL, ROW, COL, ONE = range(4)
BLOCK = 4096  # cols when every operand is FULL or ONE: a 1-D run, cut into blocks for the threads


@njit(inline="always")
def part(kind, a, r, base, width):
    """The slice of an operand of this kind that row r of the output (elements base .. base+width) reads."""
    if kind == FULL:
        return a[base:base + width]
    if kind == ROW:
        return a[:width]
    if kind == COL:
        return a[r:r + 1]
    return a[:1]


def kind(shape, out_shape):
    """The course's answer to exercise 06.8 (`row_layout`): read it once your check passes.

    FULL, ROW, COL or ONE: how a contiguous operand of `shape` is read when broadcast to `out_shape`
    (None: none of these); a ROW is any block of the output's trailing dims, (T, C) in (B, T, C)."""
    size = math.prod(shape)
    if size == 1:
        return ONE
    padded = (1,) * (len(out_shape) - len(shape)) + tuple(shape)  # numpy aligns dims on the right
    if padded == out_shape:
        return FULL
    trailing = tuple(shape)
    while trailing[0] == 1:
        trailing = trailing[1:]
    if trailing == out_shape[len(out_shape) - len(trailing):]:
        return ROW
    if padded[-1] == 1 and padded[:-1] == out_shape[:-1]:
        return COL
    return None


@functools.lru_cache(maxsize=4096)
def plan(out_shape, *shapes):
    """(kinds, cols) to run a call on contiguous operands of `shapes` into a contiguous output, or None.

    A ROW operand needs rows of its own size, a COL one rows of out_shape[-1]; FULL and ONE fit any."""
    kinds = tuple(kind(shape, out_shape) for shape in shapes)
    if None in kinds:
        return None
    needs = {math.prod(shape) if k == ROW else out_shape[-1] for k, shape in zip(kinds, shapes) if k in (ROW, COL)}
    if len(needs) > 1:
        return None
    return kinds, needs.pop() if needs else BLOCK


@functools.cache
def flat_map(op, parallel=False):
    """The course's answer to exercise 06.7 (`flat_kernels`): read it once your check passes.

    A kernel out[i] = unary(op, a[i]) for contiguous out and a of the same size, in rows of `cols`."""
    loop = prange if parallel else range

    @njit(parallel=parallel, **JIT)
    def kernel(out, a, cols):
        size = out.size
        for r in loop((size + cols - 1) // cols):
            base = r * cols
            width = min(cols, size - base)
            o, x = out[base:base + width], a[base:base + width]
            for j in range(width):
                o[j] = unary(op, x[j])
    return kernel


@functools.cache
def flat_zip(op, a_kind, b_kind, parallel=False):
    """The course's answer to exercise 06.7 (`flat_kernels`): read it once your check passes.

    A kernel out = binary(op, a, b) for the contiguous out, read as rows of `cols`; a and b by their kinds."""
    a_spread, b_spread = a_kind in (FULL, ROW), b_kind in (FULL, ROW)  # one element per j, or one per row
    loop = prange if parallel else range

    @njit(parallel=parallel, **JIT)
    def kernel(out, a, b, cols):
        size = out.size
        for r in loop((size + cols - 1) // cols):
            base = r * cols
            width = min(cols, size - base)
            o, x, y = out[base:base + width], part(a_kind, a, r, base, width), part(b_kind, b, r, base, width)
            for j in range(width):
                o[j] = binary(op, x[j] if a_spread else x[0], y[j] if b_spread else y[0])
    return kernel


@functools.cache
def flat_reduce_last(op, parallel=False):
    """A kernel out[r] = fold(op) over row r of the contiguous a, read as rows of n: a reduction over
    the last dim (softmax's max and sum, layer norm's mean), one row per iteration. Sums accumulate
    in float64, as in ops.reduce_kernel.

    With one accumulator, every add waits for the one before it (about 4 cycles). Four accumulators,
    element j going to number j % 4, are four independent chains that the CPU overlaps; they are
    folded together at the end of the row."""
    start, loop = START[op], prange if parallel else range

    @njit(parallel=parallel, **JIT)
    def kernel(out, a, n):
        whole = n - n % 4
        for r in loop(out.size):
            x = a[r * n:(r + 1) * n]
            acc0 = acc1 = acc2 = acc3 = start
            for j in range(0, whole, 4):
                four = x[j:j + 4]
                acc0 = fold(op, acc0, four[0])
                acc1 = fold(op, acc1, four[1])
                acc2 = fold(op, acc2, four[2])
                acc3 = fold(op, acc3, four[3])
            acc = fold(op, fold(op, acc0, acc1), fold(op, acc2, acc3))
            for j in range(whole, n):
                acc = fold(op, acc, x[j])
            out[r] = acc
    return kernel


WIDE = 1024  # outputs per block in flat_reduce_inner: 8 KB of float64 accumulators, held in L1


@functools.cache
def flat_reduce_inner(op, parallel=False):
    """The course's answer to exercise 06.10 (`sum_columns`): read it once your check passes.

    A kernel for a reduction over a dim that is not the last, of a contiguous a read as
    (outer, n, inner): out[o, i] = fold(op) over k of a[o, k, i] (a bias's gradient sums a (rows, m)
    gradient over its rows: outer 1, n rows, inner m).

    The outputs go in blocks of up to WIDE neighbours, one float64 accumulator each; the threads
    share the blocks. For each k the block's inner loop reads a at stride 1, so it vectorizes.
    The strided kernel of ops.py would find every position through position() instead."""
    start, loop = START[op], prange if parallel else range

    @njit(parallel=parallel, **JIT)
    def kernel(out, a, n, inner):
        per_row = (inner + WIDE - 1) // WIDE
        for blk in loop((out.size // inner) * per_row):
            o, lo = blk // per_row, (blk % per_row) * WIDE
            width = min(WIDE, inner - lo)
            acc = np.full(width, start)
            for k in range(n):
                base = (o * n + k) * inner + lo
                x = a[base:base + width]
                for i in range(width):
                    acc[i] = fold(op, acc[i], x[i])
            row = out[o * inner + lo:o * inner + lo + width]
            for i in range(width):
                row[i] = acc[i]
    return kernel


@functools.cache
def flat_where(c_kind, a_kind, b_kind, parallel=False):
    """A kernel out = a if c != 0 else b, for the contiguous out read as rows of `cols`; c, a, b by their kinds."""
    c_spread, a_spread, b_spread = (k in (FULL, ROW) for k in (c_kind, a_kind, b_kind))
    loop = prange if parallel else range

    @njit(parallel=parallel, **JIT)
    def kernel(out, c, a, b, cols):
        size = out.size
        for r in loop((size + cols - 1) // cols):
            base = r * cols
            width = min(cols, size - base)
            o, z = out[base:base + width], part(c_kind, c, r, base, width)
            x, y = part(a_kind, a, r, base, width), part(b_kind, b, r, base, width)
            for j in range(width):
                if (z[j] if c_spread else z[0]) != 0:
                    o[j] = x[j] if a_spread else x[0]
                else:
                    o[j] = y[j] if b_spread else y[0]
    return kernel
