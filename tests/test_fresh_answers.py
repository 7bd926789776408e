"""Answers the checks of chapters 06 and 10 to 13 have never seen, written from what a learner reads.

Each exercise gets answers written independently of the course's and of tests/test_chNN_checks.py:
wrong ones that compute the right numbers on the usual inputs but break the property the chapter teaches
(memory that grows with the keys, tiles no query sees, buckets sent after the backward, the whole optimizer
state on every rank, an op that records its steps or keeps too much, a generated loop that is not parallel
over rows, a guard that misses a kind of change, a schedule off by one, clipping per tensor, a resume that
loses state), plausible mistakes with wrong numbers, and correct answers written another way (another loop
order, task split, tile walk, sharding, fusion rule, formula or layout). Every case here is judged as it
should be: a wrong answer is refused, a correct one accepted, but for the known gaps, each listed with `gap`
and the reason the check cannot see it yet (strict xfail: a gap that closes fails until it moves). Kernel
cases whose compilation takes long are marked slow (opt-in with --slow).
"""

import contextlib
import copy
import math
import pickle

import numba
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from checking import expect_failure, expect_pass
from numba import njit, prange

import course_lib.tensor as ct
from course_lib import tensor as T
from course_lib.checks import ch06, ch10, ch11, ch12, ch13
from course_lib.compiler.fuse import COL, FULL, ONE, ROW, fusable, read_kind, rows_of
from course_lib.compiler.guards import is_array
from course_lib.compiler.ir import CONST, TEMP, Node, Ref, View
from course_lib.compiler.lower import expression
from course_lib.gpt.trainer import train_step
from course_lib.simd.tiles import matmul_bt, transpose
from course_lib.tensor import Function, Tensor, no_grad
from course_lib.tensor import nn as cnn
from course_lib.tensor.tensor_data import TensorData

FM = {"reassoc", "contract", "nsz", "arcp"}
slow = pytest.mark.slow


@pytest.fixture(autouse=True)
def _isolated(workspace):
    """A passing check saves the answer: keep it in a temporary workspace."""


def case(name, check, *answers, slow_case=False):
    return pytest.param(check, answers, id=name, marks=[slow] if slow_case else [])


def gap(name, check, *answers, reason, slow_case=False):
    """A wrong answer the check does not refuse yet: a known gap, said why. Strict: once the check refuses
    it, the case fails until it moves among the refused ones."""
    return pytest.param(check, answers, id=name,
                        marks=[pytest.mark.xfail(strict=True, reason=reason)] + ([slow] if slow_case else []))


# ==================================================================================================
# Chapter 06: Numba CPU kernels
# ==================================================================================================

# ---------------------------------------------------------------- exercise 1: softplus

@njit
def softplus_branches(x, out):                 # correct: two branches instead of max + |x|
    for i in range(len(x)):
        v = x[i]
        if v > 0:
            out[i] = v + np.log1p(np.exp(-v))
        else:
            out[i] = np.log1p(np.exp(v))
    return out


@njit
def softplus_naive(x, out):                    # wrong: the formula that overflows
    for i in range(len(x)):
        out[i] = np.log(1.0 + np.exp(x[i]))
    return out


@njit
def softplus_log_not_log1p(x, out):            # wrong: log(1 + e) loses the tiny values of very negative x
    for i in range(len(x)):
        out[i] = max(x[i], 0.0) + np.log(1.0 + np.exp(-abs(x[i])))
    return out


def softplus_python(x, out):                   # breaks the exercise's point: not compiled
    for i in range(len(x)):
        out[i] = max(x[i], 0.0) + np.log1p(np.exp(-abs(x[i])))
    return out


# ---------------------------------------------------------------- exercise 2: position

@njit
def position(ordinal, shape, strides, offset):          # correct, used by the kernels below
    ordinal = np.int64(ordinal)
    pos = offset
    d = len(shape) - 1
    while d >= 0:
        ordinal, index = divmod(ordinal, shape[d])
        pos += index * strides[d]
        d -= 1
    return pos


@njit
def position_front_divisors(ordinal, shape, strides, offset):   # correct: first dim first, by block sizes
    rest = np.int64(ordinal)
    pos = offset
    for d in range(len(shape)):
        block = np.int64(1)
        for e in range(d + 1, len(shape)):
            block *= shape[e]
        index = rest // block
        rest -= index * block
        pos += index * strides[d]
    return pos


@njit
def position_first_dim_first(ordinal, shape, strides, offset):  # wrong: peels the first dim first
    ordinal = np.int64(ordinal)
    pos = offset
    for d in range(len(shape)):
        pos += (ordinal % shape[d]) * strides[d]
        ordinal //= shape[d]
    return pos


@njit
def position_unsigned(ordinal, shape, strides, offset):         # wrong: forgets np.int64 (the prange trap)
    pos = offset
    for d in range(len(shape) - 1, -1, -1):
        pos += (ordinal % shape[d]) * strides[d]
        ordinal //= shape[d]
    return pos


@njit
def position_no_offset(ordinal, shape, strides, offset):        # wrong: drops the offset
    ordinal = np.int64(ordinal)
    pos = 0
    for d in range(len(shape) - 1, -1, -1):
        pos += (ordinal % shape[d]) * strides[d]
        ordinal //= shape[d]
    return pos


# ---------------------------------------------------------------- exercise 3: strided map

@njit(parallel=True)
def map_two_positions_at_once(fn, out, out_shape, out_strides, a, a_strides):   # correct: one walk, two positions
    total = 1
    for s in out_shape:
        total *= s
    for i in prange(total):
        rest = np.int64(i)
        po = 0
        pa = 0
        for d in range(len(out_shape) - 1, -1, -1):
            index = rest % out_shape[d]
            rest //= out_shape[d]
            po += index * out_strides[d]
            pa += index * a_strides[d]
        out[po] = fn(a[pa])


@njit(parallel=True)
def map_out_strides_for_a(fn, out, out_shape, out_strides, a, a_strides):   # wrong: reads a through out's strides
    total = 1
    for s in out_shape:
        total *= s
    for i in prange(total):
        p = position(i, out_shape, out_strides, 0)
        out[p] = fn(a[p])


# ---------------------------------------------------------------- exercise 4: strided zip

@njit
def zero_broadcast_strides(out_shape, shape, strides):
    full = np.zeros(len(out_shape), np.int64)
    lead = len(out_shape) - len(shape)
    for d in range(len(shape)):
        if shape[d] != 1:
            full[lead + d] = strides[d]
    return full


@njit(parallel=True)
def zip_expanded_strides(fn, out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
    # correct: first the operands' strides at the output's rank, 0 where they repeat; then plain positions
    sa = zero_broadcast_strides(out_shape, a_shape, a_strides)
    sb = zero_broadcast_strides(out_shape, b_shape, b_strides)
    total = 1
    for s in out_shape:
        total *= s
    for i in prange(total):
        out[position(i, out_shape, out_strides, 0)] = fn(a[position(i, out_shape, sa, 0)],
                                                          b[position(i, out_shape, sb, 0)])


@njit
def broadcast_position_strides_only(ordinal, out_shape, shape, strides):   # trusts strides: ignores size-1 dims
    ordinal = np.int64(ordinal)
    pos = 0
    extra = len(out_shape) - len(shape)
    for d in range(len(out_shape) - 1, -1, -1):
        index = ordinal % out_shape[d]
        ordinal //= out_shape[d]
        if d >= extra:
            pos += index * strides[d - extra]
    return pos


@njit(parallel=True)
def zip_strides_only(fn, out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
    total = 1
    for s in out_shape:
        total *= s
    for i in prange(total):
        x = a[broadcast_position_strides_only(i, out_shape, a_shape, a_strides)]
        y = b[broadcast_position_strides_only(i, out_shape, b_shape, b_strides)]
        out[position(i, out_shape, out_strides, 0)] = fn(x, y)


@njit
def left_aligned_strides(out_shape, shape, strides):                 # wrong: aligns the shapes on the left
    full = np.zeros(len(out_shape), np.int64)
    for d in range(len(shape)):
        if shape[d] != 1:
            full[d] = strides[d]
    return full


@njit(parallel=True)
def zip_left_aligned(fn, out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
    sa = left_aligned_strides(out_shape, a_shape, a_strides)
    sb = left_aligned_strides(out_shape, b_shape, b_strides)
    total = 1
    for s in out_shape:
        total *= s
    for i in prange(total):
        out[position(i, out_shape, out_strides, 0)] = fn(a[position(i, out_shape, sa, 0)],
                                                          b[position(i, out_shape, sb, 0)])


# ---------------------------------------------------------------- exercise 5: sum along a dim

@njit(parallel=True)
def sum_kernel_backwards(out, out_shape, a, a_strides, dim, n):   # correct: its own start, summed from the end
    for i in prange(out.shape[0]):
        rest = np.int64(i)
        start = 0
        for d in range(len(out_shape) - 1, -1, -1):
            start += (rest % out_shape[d]) * a_strides[d]
            rest //= out_shape[d]
        total = 0.0
        step = a_strides[dim]
        for k in range(n - 1, -1, -1):
            total += a[start + k * step]
        out[i] = total


def sum_dim_list(a, shape, strides, dim):
    kept = [int(s) for s in shape]
    kept[dim] = 1
    out = np.zeros(int(np.prod(kept)), dtype=np.float64)
    sum_kernel_backwards(out, np.array(kept, dtype=np.int64), a, strides, dim, int(shape[dim]))
    return out.reshape(kept)


def make_sum_dim(kernel):
    def sum_dim(a, shape, strides, dim):
        out_shape = shape.copy()
        out_shape[dim] = 1
        out = np.empty(int(np.prod(out_shape)))
        kernel(out, out_shape, a, strides, dim, shape[dim])
        return out.reshape(out_shape)
    return sum_dim


@njit(parallel=True)
def sum_kernel_contiguous_start(out, out_shape, a, a_strides, dim, n):   # wrong: start = i * stride, as if contiguous
    for i in prange(out.shape[0]):
        acc = 0.0
        for k in range(n):
            acc += a[i + k * a_strides[dim]]
        out[i] = acc


# ---------------------------------------------------------------- exercise 6: matmul

@njit(parallel=True)
def matmul_row_buffer(out, a, b):                # correct: a private row, written once; blocks of 3 rows
    n, kk = a.shape
    m = b.shape[1]
    for blk in prange((n + 2) // 3):
        row = np.zeros(m)
        for i in range(blk * 3, min(n, blk * 3 + 3)):
            row[:] = 0.0
            for k in range(kk):
                x = a[i, k]
                for j in range(m):
                    row[j] += x * b[k, j]
            for j in range(m):
                out[i, j] = row[j]


@njit(parallel=True)
def matmul_no_zero(out, a, b):                   # wrong: out holds garbage
    n, kk = a.shape
    m = b.shape[1]
    for i in prange(n):
        for k in range(kk):
            x = a[i, k]
            for j in range(m):
                out[i, j] += x * b[k, j]


# ---------------------------------------------------------------- exercise 7: flat kernels

@njit
def flat_map_ok(fn, out, a):
    for i in range(len(out)):
        out[i] = fn(a[i])


@njit
def flat_zip_four_cases(fn, out, cols, a, a_row, a_spread, b, b_row, b_spread):   # correct: one loop per case
    rows = len(out) // cols
    for r in range(rows):
        o = out[r * cols:r * cols + cols]
        x = a[r * a_row:]
        y = b[r * b_row:]
        if a_spread and b_spread:
            for j in range(cols):
                o[j] = fn(x[j], y[j])
        elif a_spread:
            y0 = y[0]
            for j in range(cols):
                o[j] = fn(x[j], y0)
        elif b_spread:
            x0 = x[0]
            for j in range(cols):
                o[j] = fn(x0, y[j])
        else:
            v = fn(x[0], y[0])
            for j in range(cols):
                o[j] = v


@njit
def flat_zip_all_spread(fn, out, cols, a, a_row, a_spread, b, b_row, b_spread):   # wrong: ignores spread
    for r in range(len(out) // cols):
        o, x, y = out[r * cols:(r + 1) * cols], a[r * a_row:], b[r * b_row:]
        for j in range(cols):
            o[j] = fn(x[j], y[j])


# ---------------------------------------------------------------- exercise 8: row layout

def row_layout_by_strides(shape, out_shape):
    """Correct, written another way: the operand's strides at the output's rank, then which step reads them."""
    out_shape = [int(s) for s in out_shape]
    shape = [int(s) for s in shape]
    nd = len(out_shape)
    full = [1] * (nd - len(shape)) + shape
    cols = out_shape[-1] if nd else 1
    if full == out_shape:
        return (cols, True)
    if all(s == 1 for s in full):
        return (0, False)
    # contiguous strides of the operand, 0 along a repeated dim
    strides, step = [0] * nd, 1
    for d in range(nd - 1, -1, -1):
        strides[d] = step if full[d] == out_shape[d] and full[d] != 1 else 0
        step *= full[d]
    last = strides[-1] if nd else 0
    spread = last == 1
    if full[-1] == 1 and out_shape[-1] != 1:
        spread = False
    # the row counter walks the leading dims; row r must start at r * row_step
    lead = out_shape[:-1]
    candidates = []
    for row_step in (0, 1):
        ok, block = True, 1
        for d in range(len(lead) - 1, -1, -1):
            if lead[d] != 1 and strides[d] != row_step * block:
                ok = False
            block *= lead[d]
        if ok:
            candidates.append(row_step)
    if 0 in candidates and spread:
        return (0, True)
    if 1 in candidates and not spread and full[-1] == 1:
        return (1, False)
    return None


def row_layout_loose_column(shape, out_shape):      # wrong: a column only needs its last dim to be 1
    shape, out_shape = tuple(shape), tuple(out_shape)
    cols = out_shape[-1] if out_shape else 1
    padded = (1,) * (len(out_shape) - len(shape)) + shape
    if padded == out_shape:
        return cols, True
    if int(np.prod(shape)) == 1:
        return 0, False
    if all(s == 1 for s in padded[:-1]) and padded[-1] == cols:
        return 0, True
    if padded[-1] == 1:
        return 1, False
    return None


def row_layout_loose_row(shape, out_shape):         # wrong: a row only needs its last dim to be the output's
    shape, out_shape = tuple(shape), tuple(out_shape)
    cols = out_shape[-1] if out_shape else 1
    padded = (1,) * (len(out_shape) - len(shape)) + shape
    if padded == out_shape:
        return cols, True
    if int(np.prod(shape)) == 1:
        return 0, False
    if padded[-1] == cols:
        return 0, True
    if padded[-1] == 1 and padded[:-1] == out_shape[:-1]:
        return 1, False
    return None


def row_layout_no_0d(shape, out_shape):             # wrong: a 0-d output has no last dim
    shape, out_shape = tuple(shape), tuple(out_shape)
    cols = out_shape[-1]
    padded = (1,) * (len(out_shape) - len(shape)) + shape
    if padded == out_shape:
        return cols, True
    if int(np.prod(shape)) == 1:
        return 0, False
    if all(s == 1 for s in padded[:-1]) and padded[-1] == cols:
        return 0, True
    if padded[-1] == 1 and padded[:-1] == out_shape[:-1]:
        return 1, False
    return None


# ---------------------------------------------------------------- exercise 9: strided copy

@njit
def copy_odometer(out, out_shape, out_strides, a, a_strides):   # correct: no division at all, an odometer of indices
    nd = len(out_shape)
    n = out_shape[nd - 1]
    total = 1
    for s in out_shape:
        total *= s
    if total == 0:
        return
    index = np.zeros(nd, np.int64)
    po, pa = 0, 0
    for _ in range(total // n):
        for j in range(n):
            out[po + j * out_strides[nd - 1]] = a[pa + j * a_strides[nd - 1]]
        d = nd - 2
        while d >= 0:                       # next row: carry like an odometer
            index[d] += 1
            po += out_strides[d]
            pa += a_strides[d]
            if index[d] < out_shape[d]:
                break
            po -= index[d] * out_strides[d]
            pa -= index[d] * a_strides[d]
            index[d] = 0
            d -= 1


@njit
def copy_divides_by_zero(out, out_shape, out_strides, a, a_strides):   # wrong: no guard for an empty last dim
    n = out_shape[-1]
    total = 1
    for s in out_shape:
        total *= s
    for r in range(total // n):
        po = position(r * n, out_shape, out_strides, 0)
        pa = position(r * n, out_shape, a_strides, 0)
        for j in range(n):
            out[po + j * out_strides[-1]] = a[pa + j * a_strides[-1]]


@njit
def copy_one_stride(out, out_shape, out_strides, a, a_strides):   # wrong: both walk by out's last stride
    n = out_shape[-1]
    total = 1
    for s in out_shape:
        total *= s
    for r in range(total // n if n else 0):
        po = position(r * n, out_shape, out_strides, 0)
        pa = position(r * n, out_shape, a_strides, 0)
        for j in range(n):
            out[po + j * out_strides[-1]] = a[pa + j * out_strides[-1]]


# ---------------------------------------------------------------- exercise 10: sum down the columns

@njit
def sum_columns_zero_first(out, a, n, m):        # correct: zero everything, then add rows as slices
    for i in range(len(out)):
        out[i] = 0.0
    blocks = len(out) // m if m else 0
    for o in range(blocks):
        for k in range(n):
            start = (o * n + k) * m
            row = a[start:start + m]
            acc = out[o * m:o * m + m]
            for j in range(m):
                acc[j] += row[j]


@njit
def sum_columns_no_zero(out, a, n, m):           # wrong: adds onto what out held
    for o in range(len(out) // m):
        acc = out[o * m:(o + 1) * m]
        for k in range(n):
            row = a[(o * n + k) * m:(o * n + k + 1) * m]
            for j in range(m):
                acc[j] += row[j]


# ---------------------------------------------------------------- exercise 11: BLAS

def blas_ndarray_views(a, a_shape, a_strides, b, b_shape, b_strides):   # correct: np.ndarray over the buffer, then @
    size = a.itemsize
    va = np.ndarray(tuple(int(s) for s in a_shape), a.dtype, buffer=a, strides=tuple(int(s) * size for s in a_strides))
    vb = np.ndarray(tuple(int(s) for s in b_shape), b.dtype, buffer=b,
                    strides=tuple(int(s) * b.itemsize for s in b_strides))
    return va @ vb


def blas_contiguous_copies(a, a_shape, a_strides, b, b_shape, b_strides):   # right numbers, copies both operands
    def view(x, shape, strides):
        return np.lib.stride_tricks.as_strided(x, tuple(shape), tuple(int(s) * x.itemsize for s in strides))
    return np.matmul(np.ascontiguousarray(view(a, a_shape, a_strides)), np.ascontiguousarray(view(b, b_shape, b_strides)))


def blas_byte_strides_forgotten(a, a_shape, a_strides, b, b_shape, b_strides):   # wrong: strides in elements as bytes
    va = np.lib.stride_tricks.as_strided(a, tuple(a_shape), tuple(int(s) for s in a_strides))
    vb = np.lib.stride_tricks.as_strided(b, tuple(b_shape), tuple(int(s) for s in b_strides))
    return np.matmul(va, vb)



# ---------------------------------------------------------------- more answers of the same exercises

@njit(parallel=True)
def map_serial(fn, out, out_shape, out_strides, a, a_strides):   # wrong property: a serial range under parallel=True
    total = 1
    for s in out_shape:
        total *= s
    for i in range(total):
        out[position(i, out_shape, out_strides, 0)] = fn(a[position(i, out_shape, a_strides, 0)])


@njit(parallel=True)
def zip_serial(fn, out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
    sa = zero_broadcast_strides(out_shape, a_shape, a_strides)
    sb = zero_broadcast_strides(out_shape, b_shape, b_strides)
    total = 1
    for s in out_shape:
        total *= s
    for i in range(total):                       # wrong property: serial
        out[position(i, out_shape, out_strides, 0)] = fn(a[position(i, out_shape, sa, 0)],
                                                          b[position(i, out_shape, sb, 0)])


@njit(parallel=True)
def sum_kernel_ok(out, out_shape, a, a_strides, dim, n):
    for i in prange(out.shape[0]):
        start = position(i, out_shape, a_strides, 0)
        acc = 0.0
        for k in range(n):
            acc += a[start + k * a_strides[dim]]
        out[i] = acc


def sum_dim_numpy(a, shape, strides, dim):      # wrong property: numpy does the sum, the kernel is never called
    view = np.lib.stride_tricks.as_strided(a, tuple(shape), tuple(int(s) * a.itemsize for s in strides))
    return view.sum(axis=dim, keepdims=True)


@njit(parallel=True)
def sum_kernel_serial(out, out_shape, a, a_strides, dim, n):      # wrong property: serial
    for i in range(out.shape[0]):
        start = position(i, out_shape, a_strides, 0)
        acc = 0.0
        for k in range(n):
            acc += a[start + k * a_strides[dim]]
        out[i] = acc


@njit(parallel=True)
def sum_kernel_race(out, out_shape, a, a_strides, dim, n):        # wrong property: prange over the reduced dim
    for i in range(out.shape[0]):
        out[i] = 0.0
    for k in prange(n):
        for i in range(out.shape[0]):
            out[i] += a[position(i, out_shape, a_strides, 0) + k * a_strides[dim]]


@njit(parallel=True)
def matmul_serial(out, a, b):                    # wrong property: i-k-j, but a serial range
    n, kk = a.shape
    m = b.shape[1]
    for i in range(n):
        for j in range(m):
            out[i, j] = 0.0
        for k in range(kk):
            x = a[i, k]
            for j in range(m):
                out[i, j] += x * b[k, j]


@njit(parallel=True)
def matmul_k_outer(out, a, b):                   # wrong property: k-i-j with prange over k (a race)
    n, kk = a.shape
    m = b.shape[1]
    out[:, :] = 0.0
    for k in prange(kk):
        for i in range(n):
            x = a[i, k]
            for j in range(m):
                out[i, j] += x * b[k, j]


@njit(parallel=True)
def matmul_ijk(out, a, b):                       # correct, slower: dot products down b's columns, rows in parallel
    n, kk = a.shape
    m = b.shape[1]
    for i in prange(n):
        for j in range(m):
            s = 0.0
            for k in range(kk):
                s += a[i, k] * b[k, j]
            out[i, j] = s


@njit
def flat_zip_by_index(fn, out, cols, a, a_row, a_spread, b, b_row, b_spread):   # correct, slower: no slices
    for r in range(len(out) // cols):
        for j in range(cols):
            out[r * cols + j] = fn(a[r * a_row + (j if a_spread else 0)], b[r * b_row + (j if b_spread else 0)])


@njit(parallel=True)
def flat_zip_prange(fn, out, cols, a, a_row, a_spread, b, b_row, b_spread):   # parallel, where a plain njit is asked
    for r in prange(len(out) // cols):
        o, x, y = out[r * cols:(r + 1) * cols], a[r * a_row:], b[r * b_row:]
        for j in range(cols):
            o[j] = fn(x[j if a_spread else 0], y[j if b_spread else 0])


@njit
def copy_per_element(out, out_shape, out_strides, a, a_strides):   # right numbers, two positions per element
    total = 1
    for s in out_shape:
        total *= s
    for i in range(total):
        out[position(i, out_shape, out_strides, 0)] = a[position(i, out_shape, a_strides, 0)]


@njit
def sum_columns_by_column(out, a, n, m):         # right numbers, the column walk the exercise turns around
    for o in range(len(out) // m):
        for j in range(m):
            acc = 0.0
            for k in range(n):
                acc += a[(o * n + k) * m + j]
            out[o * m + j] = acc


def blas_einsum(a, a_shape, a_strides, b, b_shape, b_strides):   # no BLAS: einsum's own loops, no copy
    def view(x, shape, strides):
        return np.lib.stride_tricks.as_strided(x, tuple(shape), tuple(int(s) * x.itemsize for s in strides))
    return np.einsum("...ij,...jk->...ik", view(a, a_shape, a_strides), view(b, b_shape, b_strides))


# ---------------------------------------------------------------- chapter 06's cases

ACCEPT_06 = [
    case("flat_zip_by_index", ch06.flat_kernels, flat_map_ok, flat_zip_by_index),
    case("matmul_ijk_rows_parallel", ch06.matmul, matmul_ijk),
    case("softplus_branches", ch06.softplus, softplus_branches),
    case("position_divmod", ch06.position, position),
    case("position_front_divisors", ch06.position, position_front_divisors),
    case("strided_map_two_positions", ch06.strided_map, map_two_positions_at_once),
    case("strided_zip_expanded_strides", ch06.strided_zip, zip_expanded_strides),
    case("sum_dim_backwards", ch06.sum_dim, sum_dim_list, sum_kernel_backwards),
    case("matmul_row_buffer_blocks", ch06.matmul, matmul_row_buffer),
    case("flat_kernels_four_cases", ch06.flat_kernels, flat_map_ok, flat_zip_four_cases),
    case("row_layout_by_strides", ch06.row_layout, row_layout_by_strides),
    case("strided_copy_odometer", ch06.strided_copy, copy_odometer),
    case("sum_columns_zero_first", ch06.sum_columns, sum_columns_zero_first),
    case("blas_ndarray_views", ch06.blas_matmul, blas_ndarray_views),
]

REJECT_06 = [
    case("map_serial", ch06.strided_map, map_serial),
    case("zip_serial", ch06.strided_zip, zip_serial),
    case("sum_dim_numpy", ch06.sum_dim, sum_dim_numpy, sum_kernel_ok),
    case("sum_kernel_serial", ch06.sum_dim, make_sum_dim(sum_kernel_serial), sum_kernel_serial),
    case("sum_kernel_race", ch06.sum_dim, make_sum_dim(sum_kernel_race), sum_kernel_race),
    case("matmul_serial", ch06.matmul, matmul_serial),
    case("matmul_k_outer", ch06.matmul, matmul_k_outer),
    case("flat_zip_prange", ch06.flat_kernels, flat_map_ok, flat_zip_prange),
    case("copy_per_element", ch06.strided_copy, copy_per_element),
    case("sum_columns_by_column", ch06.sum_columns, sum_columns_by_column),
    case("blas_einsum", ch06.blas_matmul, blas_einsum),
    case("softplus_naive", ch06.softplus, softplus_naive),
    case("softplus_log_not_log1p", ch06.softplus, softplus_log_not_log1p),
    case("softplus_not_compiled", ch06.softplus, softplus_python),
    case("position_first_dim_first", ch06.position, position_first_dim_first),
    case("position_unsigned", ch06.position, position_unsigned),
    case("position_no_offset", ch06.position, position_no_offset),
    case("map_out_strides_for_a", ch06.strided_map, map_out_strides_for_a),
    case("zip_strides_only", ch06.strided_zip, zip_strides_only),
    case("zip_left_aligned", ch06.strided_zip, zip_left_aligned),
    case("sum_kernel_contiguous_start", ch06.sum_dim, make_sum_dim(sum_kernel_contiguous_start),
         sum_kernel_contiguous_start),
    case("matmul_no_zero", ch06.matmul, matmul_no_zero),
    case("flat_zip_all_spread", ch06.flat_kernels, flat_map_ok, flat_zip_all_spread),
    case("row_layout_loose_column", ch06.row_layout, row_layout_loose_column),
    case("row_layout_loose_row", ch06.row_layout, row_layout_loose_row),
    case("row_layout_no_0d", ch06.row_layout, row_layout_no_0d),
    case("copy_divides_by_zero", ch06.strided_copy, copy_divides_by_zero),
    case("copy_one_stride", ch06.strided_copy, copy_one_stride),
    case("sum_columns_no_zero", ch06.sum_columns, sum_columns_no_zero),
    case("blas_contiguous_copies", ch06.blas_matmul, blas_contiguous_copies),
    case("blas_byte_strides_forgotten", ch06.blas_matmul, blas_byte_strides_forgotten),
]


# ==================================================================================================
# Chapter 10: fused kernels (all but flash_forward_cuda)
# ==================================================================================================

# ---------------------------------------------------------------- 1. online softmax update

def online_update_rows(m, l, acc, scores, values):
    """Correct, written row by row in plain Python: the running max, then one rebasing factor per row."""
    n = scores.shape[0]
    m2, l2, acc2 = np.empty(n), np.empty(n), np.empty((n, values.shape[1]))
    for r in range(n):
        new_max = max(m[r], float(np.max(scores[r])))
        keep = 0.0 if m[r] == -math.inf else math.exp(m[r] - new_max)
        w = np.exp(scores[r] - new_max)
        m2[r] = new_max
        l2[r] = l[r] * keep + w.sum()
        acc2[r] = acc[r] * keep + w @ values
    return m2, l2, acc2


def online_no_rescale(m, l, acc, scores, values):          # wrong: the old sums stay on the old max
    m2 = np.maximum(m, scores.max(axis=1))
    w = np.exp(scores - m2[:, None])
    return m2, l + w.sum(axis=1), acc + w @ values


def online_rescale_l_only(m, l, acc, scores, values):      # wrong: rescales l, forgets acc
    m2 = np.maximum(m, scores.max(axis=1))
    f = np.exp(m - m2)
    w = np.exp(scores - m2[:, None])
    return m2, f * l + w.sum(axis=1), acc + w @ values


def online_exp_then_shift(m, l, acc, scores, values):      # right on small scores; exp(scores) overflows in the hundreds
    m2 = np.maximum(m, scores.max(axis=1))
    f = np.exp(m - m2)
    w = np.exp(scores) * np.exp(-m2)[:, None]
    return m2, f * l + w.sum(axis=1), f[:, None] * acc + w @ values


# ---------------------------------------------------------------- 2. fused scan

@numba.njit(parallel=True, fastmath=FM, cache=True)
def scan_channels_outer(x, delta, A, B, C, D, y, h_last, ckpt, chunk):
    """Correct, another layout: prange over channels, the batch inside; math.exp; a chunk counter."""
    nb, L, Dm = x.shape
    N = A.shape[1]
    for d in prange(Dm):
        state = np.empty(N, x.dtype)
        for b in range(nb):
            for n in range(N):
                state[n] = 0
            c, left = 0, 0
            for t in range(L):
                if left == 0:
                    ckpt[b, c, d, :] = state
                    c += 1
                    left = chunk
                left -= 1
                dt = delta[b, t, d]
                xt = x[b, t, d]
                total = D[d] * xt
                for n in range(N):
                    state[n] = math.exp(dt * A[d, n]) * state[n] + dt * xt * B[b, t, n]
                    total += state[n] * C[b, t, n]
                y[b, t, d] = total
            h_last[b, d, :] = state


@numba.njit(parallel=True, fastmath=FM, cache=True)
def scan_keeps_history(x, delta, A, B, C, D, y, h_last, ckpt, chunk):
    """Right numbers; every state of the sequence kept (L x N per task): memory grows with L."""
    nb, L, Dm = x.shape
    N = A.shape[1]
    for pair in prange(nb * Dm):
        b, d = pair // Dm, pair % Dm
        hist = np.zeros((L + 1, N), x.dtype)
        for t in range(L):
            for n in range(N):
                hist[t + 1, n] = math.exp(delta[b, t, d] * A[d, n]) * hist[t, n] + delta[b, t, d] * x[b, t, d] * B[b, t, n]
        for t in range(L):
            s = D[d] * x[b, t, d]
            for n in range(N):
                s += C[b, t, n] * hist[t + 1, n]
            y[b, t, d] = s
            if t % chunk == 0:
                ckpt[b, t // chunk, d, :] = hist[t]
        h_last[b, d, :] = hist[L]


@numba.njit(parallel=True, fastmath=FM, cache=True)
def scan_ckpt_after_step(x, delta, A, B, C, D, y, h_last, ckpt, chunk):
    """Wrong: the checkpoint holds the state after the chunk's first step."""
    nb, L, Dm = x.shape
    N = A.shape[1]
    for pair in prange(nb * Dm):
        b, d = pair // Dm, pair % Dm
        h = np.zeros(N, x.dtype)
        for t in range(L):
            s = D[d] * x[b, t, d]
            for n in range(N):
                h[n] = math.exp(delta[b, t, d] * A[d, n]) * h[n] + delta[b, t, d] * x[b, t, d] * B[b, t, n]
                s += C[b, t, n] * h[n]
            y[b, t, d] = s
            if t % chunk == 0:
                ckpt[b, t // chunk, d, :] = h
        h_last[b, d, :] = h


# ---------------------------------------------------------------- 3. flash forward

@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_rowwise_online(q, k, v, out, lse, scale, causal, BQ, BK):
    """Correct, written differently: tile-major task order, explicit loops (no tile products), each row folds
    one key tile at a time with its own running max, sum and accumulator."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    shift = Tk - Tq
    n_qt = (Tq + BQ - 1) // BQ
    for job in prange(BH * n_qt):
        qt, h = job // BH, job % BH
        lo = qt * BQ
        hi = min(Tq, lo + BQ)
        rows = hi - lo
        run_max = np.empty(rows, q.dtype)
        run_sum = np.empty(rows, q.dtype)
        acc = np.empty((rows, dv), q.dtype)
        s = np.empty(BK, q.dtype)
        for r in range(rows):
            run_max[r] = -np.inf
            run_sum[r] = 0
            for c in range(dv):
                acc[r, c] = 0
        kend = min(Tk, hi + shift) if causal else Tk
        for j0 in range(0, kend, BK):
            j1 = min(kend, j0 + BK)
            for r in range(rows):
                lim = min(j1, lo + r + shift + 1) if causal else j1
                if lim <= j0:
                    continue
                top = run_max[r]
                for j in range(j0, lim):
                    t = q.dtype.type(0)
                    for c in range(d):
                        t += q[h, lo + r, c] * k[h, j, c]
                    s[j - j0] = t * scale
                    if s[j - j0] > top:
                        top = s[j - j0]
                f = math.exp(run_max[r] - top)
                run_sum[r] *= f
                for c in range(dv):
                    acc[r, c] *= f
                for j in range(j0, lim):
                    w = math.exp(s[j - j0] - top)
                    run_sum[r] += w
                    for c in range(dv):
                        acc[r, c] += w * v[h, j, c]
                run_max[r] = top
        for r in range(rows):
            for c in range(dv):
                out[h, lo + r, c] = acc[r, c] / run_sum[r]
            lse[h, lo + r] = run_max[r] + math.log(run_sum[r])


@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_whole_row(q, k, v, out, lse, scale, causal, BQ, BK):
    """Right numbers, no online softmax: each row's Tk scores in a buffer, then one plain softmax."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    shift = Tk - Tq
    n_qt = (Tq + BQ - 1) // BQ
    for job in prange(BH * n_qt):
        h, lo = job // n_qt, job % n_qt * BQ
        s = np.empty(Tk, q.dtype)
        for i in range(lo, min(Tq, lo + BQ)):
            last = min(Tk, i + shift + 1) if causal else Tk
            top = -np.inf
            for j in range(last):
                t = q.dtype.type(0)
                for c in range(d):
                    t += q[h, i, c] * k[h, j, c]
                s[j] = t * scale
                top = max(top, s[j])
            total = q.dtype.type(0)
            for j in range(last):
                s[j] = math.exp(s[j] - top)
                total += s[j]
            for c in range(dv):
                a = q.dtype.type(0)
                for j in range(last):
                    a += s[j] * v[h, j, c]
                out[h, i, c] = a / total
            lse[h, i] = top + math.log(total)


@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_max_from_zero(q, k, v, out, lse, scale, causal, BQ, BK):
    """Wrong: the running max starts at 0."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    shift = Tk - Tq
    n_qt = (Tq + BQ - 1) // BQ
    for job in prange(BH * n_qt):
        qt, h = job // BH, job % BH
        lo = qt * BQ
        hi = min(Tq, lo + BQ)
        rows = hi - lo
        run_max = np.zeros(rows, q.dtype)
        run_sum = np.zeros(rows, q.dtype)
        acc = np.zeros((rows, dv), q.dtype)
        s = np.empty(BK, q.dtype)
        kend = min(Tk, hi + shift) if causal else Tk
        for j0 in range(0, kend, BK):
            j1 = min(kend, j0 + BK)
            for r in range(rows):
                lim = min(j1, lo + r + shift + 1) if causal else j1
                if lim <= j0:
                    continue
                top = run_max[r]
                for j in range(j0, lim):
                    t = q.dtype.type(0)
                    for c in range(d):
                        t += q[h, lo + r, c] * k[h, j, c]
                    s[j - j0] = t * scale
                    top = max(top, s[j - j0])
                f = math.exp(run_max[r] - top)
                run_sum[r] *= f
                for c in range(dv):
                    acc[r, c] *= f
                for j in range(j0, lim):
                    w = math.exp(s[j - j0] - top)
                    run_sum[r] += w
                    for c in range(dv):
                        acc[r, c] += w * v[h, j, c]
                run_max[r] = top
        for r in range(rows):
            for c in range(dv):
                out[h, lo + r, c] = acc[r, c] / run_sum[r]
            lse[h, lo + r] = run_max[r] + math.log(run_sum[r])


@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_all_tiles_weight_zero(q, k, v, out, lse, scale, causal, BQ, BK):
    """Right numbers; every key tile visited, a hidden key weighs 0 (set by assignment) in the whole-tile loops."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    shift = Tk - Tq
    n_qt = (Tq + BQ - 1) // BQ
    for job in prange(BH * n_qt):
        qt, h = job // BH, job % BH
        lo = qt * BQ
        hi = min(Tq, lo + BQ)
        rows = hi - lo
        run_max = np.full(rows, -np.inf, q.dtype)
        run_sum = np.zeros(rows, q.dtype)
        acc = np.zeros((rows, dv), q.dtype)
        s = np.empty(BK, q.dtype)
        for j0 in range(0, Tk, BK):
            j1 = min(Tk, j0 + BK)
            for r in range(rows):
                lim = min(j1, lo + r + shift + 1) if causal else j1
                top = run_max[r]
                for j in range(j0, j1):
                    t = q.dtype.type(0)
                    for c in range(d):
                        t += q[h, lo + r, c] * k[h, j, c]
                    s[j - j0] = t * scale
                    if j < lim:
                        top = max(top, s[j - j0])
                if top == -np.inf:
                    continue
                f = math.exp(run_max[r] - top)
                run_sum[r] *= f
                for c in range(dv):
                    acc[r, c] *= f
                for j in range(j0, j1):
                    w = math.exp(s[j - j0] - top) if j < lim else 0.0
                    run_sum[r] += w
                    for c in range(dv):
                        acc[r, c] += w * v[h, j, c]
                run_max[r] = top
        for r in range(rows):
            for c in range(dv):
                out[h, lo + r, c] = acc[r, c] / run_sum[r]
            lse[h, lo + r] = run_max[r] + math.log(run_sum[r])


@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_square_mask(q, k, v, out, lse, scale, causal, BQ, BK):
    """Wrong: the causal mask as if Tq == Tk (query i sees keys 0..i)."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    n_qt = (Tq + BQ - 1) // BQ
    for job in prange(BH * n_qt):
        qt, h = job // BH, job % BH
        lo = qt * BQ
        hi = min(Tq, lo + BQ)
        rows = hi - lo
        run_max = np.full(rows, -np.inf, q.dtype)
        run_sum = np.zeros(rows, q.dtype)
        acc = np.zeros((rows, dv), q.dtype)
        s = np.empty(BK, q.dtype)
        kend = min(Tk, hi) if causal else Tk
        for j0 in range(0, kend, BK):
            j1 = min(kend, j0 + BK)
            for r in range(rows):
                lim = min(j1, lo + r + 1) if causal else j1
                if lim <= j0:
                    continue
                top = run_max[r]
                for j in range(j0, lim):
                    t = q.dtype.type(0)
                    for c in range(d):
                        t += q[h, lo + r, c] * k[h, j, c]
                    s[j - j0] = t * scale
                    top = max(top, s[j - j0])
                f = math.exp(run_max[r] - top)
                run_sum[r] *= f
                for c in range(dv):
                    acc[r, c] *= f
                for j in range(j0, lim):
                    w = math.exp(s[j - j0] - top)
                    run_sum[r] += w
                    for c in range(dv):
                        acc[r, c] += w * v[h, j, c]
                run_max[r] = top
        for r in range(rows):
            for c in range(dv):
                out[h, lo + r, c] = acc[r, c] / run_sum[r]
            lse[h, lo + r] = run_max[r] + math.log(run_sum[r])


# ---------------------------------------------------------------- 4. flash backward

@numba.njit(parallel=True, fastmath=FM, cache=True)
def fb_two_sweeps(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK):
    """Correct, FlashAttention-2's split: one sweep of tasks per (head, key tile) writes dk and dv, a second
    per (head, query tile) writes dq; explicit loops, every probability rebuilt from lse."""
    BH, Tq, d = q.shape
    Tk, dvs = k.shape[1], v.shape[2]
    shift = Tk - Tq
    Drow = np.empty((BH, Tq), q.dtype)
    for job in prange(BH * Tq):
        h, i = job // Tq, job % Tq
        t = q.dtype.type(0)
        for c in range(dvs):
            t += do[h, i, c] * o[h, i, c]
        Drow[h, i] = t
    n_kt = (Tk + BK - 1) // BK
    for job in prange(BH * n_kt):
        h, j0 = job // n_kt, job % n_kt * BK
        j1 = min(Tk, j0 + BK)
        gk = np.zeros((j1 - j0, d), q.dtype)
        gv = np.zeros((j1 - j0, dvs), q.dtype)
        first = max(0, j0 - shift) if causal else 0          # the first query that sees key j0
        for i in range(first, Tq):
            for j in range(j0, j1):
                if causal and j > i + shift:
                    break
                t = q.dtype.type(0)
                for c in range(d):
                    t += q[h, i, c] * k[h, j, c]
                p = math.exp(t * scale - lse[h, i])
                dp = q.dtype.type(0)
                for c in range(dvs):
                    dp += do[h, i, c] * v[h, j, c]
                    gv[j - j0, c] += p * do[h, i, c]
                ds = p * (dp - Drow[h, i]) * scale
                for c in range(d):
                    gk[j - j0, c] += ds * q[h, i, c]
        for j in range(j0, j1):
            for c in range(d):
                dk[h, j, c] = gk[j - j0, c]
            for c in range(dvs):
                dv[h, j, c] = gv[j - j0, c]
    n_qt = (Tq + BQ - 1) // BQ
    for job in prange(BH * n_qt):
        h, i0 = job // n_qt, job % n_qt * BQ
        for i in range(i0, min(Tq, i0 + BQ)):
            g = np.zeros(d, q.dtype)
            last = min(Tk, i + shift + 1) if causal else Tk
            for j in range(last):
                t = q.dtype.type(0)
                for c in range(d):
                    t += q[h, i, c] * k[h, j, c]
                p = math.exp(t * scale - lse[h, i])
                dp = q.dtype.type(0)
                for c in range(dvs):
                    dp += do[h, i, c] * v[h, j, c]
                ds = p * (dp - Drow[h, i]) * scale
                for c in range(d):
                    g[c] += ds * k[h, j, c]
            for c in range(d):
                dq[h, i, c] = g[c]


@numba.njit(parallel=True, fastmath=FM, cache=True)
def fb_stores_P(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK):
    """Right numbers; each head's whole P (Tq, Tk) stored: memory grows as T^2."""
    BH, Tq, d = q.shape
    Tk, dvs = k.shape[1], v.shape[2]
    shift = Tk - Tq
    for h in prange(BH):
        P = np.zeros((Tq, Tk), q.dtype)
        dS = np.zeros((Tq, Tk), q.dtype)
        for i in range(Tq):
            last = min(Tk, i + shift + 1) if causal else Tk
            Di = q.dtype.type(0)
            for c in range(dvs):
                Di += do[h, i, c] * o[h, i, c]
            for j in range(last):
                t = q.dtype.type(0)
                for c in range(d):
                    t += q[h, i, c] * k[h, j, c]
                P[i, j] = math.exp(t * scale - lse[h, i])
                dp = q.dtype.type(0)
                for c in range(dvs):
                    dp += do[h, i, c] * v[h, j, c]
                dS[i, j] = P[i, j] * (dp - Di) * scale
        for i in range(Tq):
            for c in range(d):
                t = q.dtype.type(0)
                for j in range(Tk):
                    t += dS[i, j] * k[h, j, c]
                dq[h, i, c] = t
        for j in range(Tk):
            for c in range(d):
                t = q.dtype.type(0)
                for i in range(Tq):
                    t += dS[i, j] * q[h, i, c]
                dk[h, j, c] = t
            for c in range(dvs):
                t = q.dtype.type(0)
                for i in range(Tq):
                    t += P[i, j] * do[h, i, c]
                dv[h, j, c] = t


@numba.njit(parallel=True, fastmath=FM, cache=True)
def fb_no_skip_matmul(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK):
    """Right numbers; every (query tile, key tile) pair visited with tile products, hidden entries set to 0."""
    BH, Tq, d = q.shape
    Tk, dvs = k.shape[1], v.shape[2]
    shift = Tk - Tq
    for h in prange(BH):
        Drow = np.empty(Tq, q.dtype)
        for i in range(Tq):
            t = q.dtype.type(0)
            for c in range(dvs):
                t += do[h, i, c] * o[h, i, c]
            Drow[i] = t
            for c in range(d):
                dq[h, i, c] = 0
        S = np.empty((BQ, BK), q.dtype)
        G = np.empty((BQ, BK), q.dtype)
        St = np.empty((BK, BQ), q.dtype)
        Gt = np.empty((BK, BQ), q.dtype)
        kT = np.empty((d, BK), q.dtype)
        qT = np.empty((d, BQ), q.dtype)
        doT = np.empty((dvs, BQ), q.dtype)
        gk = np.empty((BK, d), q.dtype)
        gv = np.empty((BK, dvs), q.dtype)
        for j0 in range(0, Tk, BK):
            nk = min(BK, Tk - j0)
            gk[:, :] = 0
            gv[:, :] = 0
            transpose(k[h, j0:], kT, nk, d)
            for i0 in range(0, Tq, BQ):
                nq = min(BQ, Tq - i0)
                matmul_bt(q[h, i0:], k[h, j0:], S, nq, nk, d, False)
                matmul_bt(do[h, i0:], v[h, j0:], G, nq, nk, dvs, False)
                for i in range(nq):
                    for j in range(nk):
                        if causal and j0 + j > i0 + i + shift:
                            S[i, j] = 0
                            G[i, j] = 0
                        else:
                            S[i, j] = math.exp(S[i, j] * scale - lse[h, i0 + i])
                            G[i, j] = S[i, j] * (G[i, j] - Drow[i0 + i])
                transpose(S, St, nq, nk)
                transpose(G, Gt, nq, nk)
                transpose(do[h, i0:], doT, nq, dvs)
                transpose(q[h, i0:], qT, nq, d)
                matmul_bt(St, doT, gv, nk, dvs, nq, True)
                matmul_bt(Gt, qT, gk, nk, d, nq, True)
                matmul_bt(G, kT, dq[h, i0:], nq, d, nk, True)
            for j in range(nk):
                for c in range(d):
                    dk[h, j0 + j, c] = gk[j, c] * scale
                for c in range(dvs):
                    dv[h, j0 + j, c] = gv[j, c]
        for i in range(Tq):
            for c in range(d):
                dq[h, i, c] *= scale


@numba.njit(parallel=True, fastmath=FM, cache=True)
def fb_dq_not_zeroed(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK):
    """Wrong: adds into dq, which arrives full of NaN."""
    BH, Tq, d = q.shape
    Tk, dvs = k.shape[1], v.shape[2]
    shift = Tk - Tq
    for h in prange(BH):
        for j in range(Tk):
            for c in range(d):
                dk[h, j, c] = 0
            for c in range(dvs):
                dv[h, j, c] = 0
        for i in range(Tq):
            Di = q.dtype.type(0)
            for c in range(dvs):
                Di += do[h, i, c] * o[h, i, c]
            last = min(Tk, i + shift + 1) if causal else Tk
            for j in range(last):
                t = q.dtype.type(0)
                for c in range(d):
                    t += q[h, i, c] * k[h, j, c]
                p = math.exp(t * scale - lse[h, i])
                dp = q.dtype.type(0)
                for c in range(dvs):
                    dp += do[h, i, c] * v[h, j, c]
                    dv[h, j, c] += p * do[h, i, c]
                ds = p * (dp - Di) * scale
                for c in range(d):
                    dk[h, j, c] += ds * q[h, i, c]
                    dq[h, i, c] += ds * k[h, j, c]


@numba.njit(parallel=True, fastmath=FM, cache=True)
def fb_dk_unscaled(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK):
    """Wrong: forgets the scale in dK."""
    BH, Tq, d = q.shape
    Tk, dvs = k.shape[1], v.shape[2]
    shift = Tk - Tq
    for h in prange(BH):
        for j in range(Tk):
            for c in range(d):
                dk[h, j, c] = 0
            for c in range(dvs):
                dv[h, j, c] = 0
        for i in range(Tq):
            for c in range(d):
                dq[h, i, c] = 0
            Di = q.dtype.type(0)
            for c in range(dvs):
                Di += do[h, i, c] * o[h, i, c]
            last = min(Tk, i + shift + 1) if causal else Tk
            for j in range(last):
                t = q.dtype.type(0)
                for c in range(d):
                    t += q[h, i, c] * k[h, j, c]
                p = math.exp(t * scale - lse[h, i])
                dp = q.dtype.type(0)
                for c in range(dvs):
                    dp += do[h, i, c] * v[h, j, c]
                    dv[h, j, c] += p * do[h, i, c]
                ds = p * (dp - Di)
                for c in range(d):
                    dk[h, j, c] += ds * q[h, i, c]
                    dq[h, i, c] += ds * k[h, j, c] * scale


# ---------------------------------------------------------------- 6. the operator

def register_attention_functional(name, forward_kernel, backward_kernel):
    """Correct, written another way: the function forms of torch.library, outputs made (B*H, T, .) and viewed
    back, the backward op defined first."""
    def heads(t):
        t = t.detach().contiguous()
        return t.view(-1, t.shape[-2], t.shape[-1]).numpy()

    @torch.library.custom_op(name + "_backward", mutates_args=())
    def grads_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, dout: torch.Tensor,
                 lse: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, H = q.shape[0], q.shape[1]
        dq = torch.empty(B * H, *q.shape[2:], dtype=q.dtype)
        dk = torch.empty(B * H, *k.shape[2:], dtype=k.dtype)
        dv = torch.empty(B * H, *v.shape[2:], dtype=v.dtype)
        qn = heads(q)
        lse_n = lse.detach().contiguous().view(B * H, -1).numpy()
        backward_kernel(qn, heads(k), heads(v), heads(out), heads(dout), lse_n, dq.numpy(), dk.numpy(), dv.numpy(),
                        np.dtype(qn.dtype).type(scale), causal, 64, 64)
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)

    torch.library.register_fake(name + "_backward")(
        lambda q, k, v, out, dout, lse, causal, scale: (torch.empty_like(q, memory_format=torch.contiguous_format),
                                                         torch.empty_like(k, memory_format=torch.contiguous_format),
                                                         torch.empty_like(v, memory_format=torch.contiguous_format)))

    @torch.library.custom_op(name, mutates_args=())
    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        B, H, T = q.shape[:3]
        out = torch.empty(B * H, T, v.shape[-1], dtype=q.dtype)
        lse = torch.empty(B * H, T, dtype=q.dtype)
        qn = heads(q)
        forward_kernel(qn, heads(k), heads(v), out.numpy(), lse.numpy(), np.dtype(qn.dtype).type(scale), causal, 64, 64)
        return out.view(B, H, T, -1), lse.view(B, H, T)

    def fake(q, k, v, causal, scale):
        B, H, T = q.shape[:3]
        return q.new_empty(B, H, T, v.shape[-1]), q.new_empty(B, H, T)

    torch.library.register_fake(name)(fake)

    def setup(ctx, inputs, output):
        q, k, v, causal, scale = inputs
        out, lse = output
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.flags = (causal, scale)

    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        causal, scale = ctx.flags
        dq, dk, dv = grads_op(q, k, v, out, grad_out, lse, causal, scale)
        return dq, dk, dv, None, None

    torch.library.register_autograd(name, backward, setup_context=setup)
    return attn


def register_attention_numpy_backward(name, forward_kernel, backward_kernel):
    """Right numbers; the backward formula calls the kernel on .numpy() itself, with no backward op."""
    def heads(t):
        return t.detach().contiguous().reshape(-1, *t.shape[2:]).numpy()

    @torch.library.custom_op(name, mutates_args=())
    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = q.new_empty(*q.shape[:3], v.shape[-1]), q.new_empty(q.shape[:3])
        qn = heads(q)
        forward_kernel(qn, heads(k), heads(v), heads(out), heads(lse), qn.dtype.type(scale), causal, 64, 64)
        return out, lse

    @attn.register_fake
    def _(q, k, v, causal, scale):
        return q.new_empty(*q.shape[:3], v.shape[-1]), q.new_empty(q.shape[:3])

    def setup(ctx, inputs, output):
        q, k, v, causal, scale = inputs
        ctx.save_for_backward(q, k, v, *output)
        ctx.mark_non_differentiable(output[1])
        ctx.causal, ctx.scale = causal, scale

    def backward(ctx, dout, _):
        q, k, v, out, lse = ctx.saved_tensors
        grads = [torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v)]
        qn = heads(q)
        backward_kernel(qn, heads(k), heads(v), heads(out), heads(dout), heads(lse), *map(heads, grads),
                        qn.dtype.type(ctx.scale), ctx.causal, 64, 64)
        return *grads, None, None

    attn.register_autograd(backward, setup_context=setup)
    return attn


def register_attention_empty_like(name, forward_kernel, backward_kernel):
    """Wrong: out = empty_like(q) keeps q's transposed strides, so the numpy view the kernel writes is a copy."""
    def heads(t):
        return t.detach().contiguous().reshape(-1, *t.shape[2:]).numpy()

    @torch.library.custom_op(name, mutates_args=())
    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
        qn = heads(q)
        forward_kernel(qn, heads(k), heads(v), out.reshape(-1, *out.shape[2:]).numpy(), heads(lse),
                       qn.dtype.type(scale), causal, 64, 64)
        return out, lse

    @attn.register_fake
    def _(q, k, v, causal, scale):
        return torch.empty_like(q), q.new_empty(q.shape[:3])

    @torch.library.custom_op(name + "_backward", mutates_args=())
    def grads_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, dout: torch.Tensor,
                 lse: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        grads = [torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v)]
        qn = heads(q)
        backward_kernel(qn, heads(k), heads(v), heads(out), heads(dout), heads(lse), *map(heads, grads),
                        qn.dtype.type(scale), causal, 64, 64)
        return tuple(grads)

    @grads_op.register_fake
    def _(q, k, v, out, dout, lse, causal, scale):
        return tuple(torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v))

    def setup(ctx, inputs, output):
        q, k, v, causal, scale = inputs
        ctx.save_for_backward(q, k, v, *output)
        ctx.mark_non_differentiable(output[1])
        ctx.causal, ctx.scale = causal, scale

    def backward(ctx, dout, _):
        q, k, v, out, lse = ctx.saved_tensors
        return *grads_op(q, k, v, out, dout, lse, ctx.causal, ctx.scale), None, None

    attn.register_autograd(backward, setup_context=setup)
    return attn

# ---------------------------------------------------------------- more answers of the same exercises

@numba.njit(parallel=True, fastmath=FM, cache=True)
def scan_serial(x, delta, A, B, C, D, y, h_last, ckpt, chunk):
    """Right numbers, flat memory, but a serial range under parallel=True."""
    nb, L, Dm = x.shape
    N = A.shape[1]
    for pair in range(nb * Dm):
        b, d = pair // Dm, pair % Dm
        h = np.zeros(N, x.dtype)
        for t in range(L):
            if t % chunk == 0:
                ckpt[b, t // chunk, d, :] = h
            s = D[d] * x[b, t, d]
            for n in range(N):
                h[n] = math.exp(delta[b, t, d] * A[d, n]) * h[n] + delta[b, t, d] * x[b, t, d] * B[b, t, n]
                s += C[b, t, n] * h[n]
            y[b, t, d] = s
        h_last[b, d, :] = h


@numba.njit(parallel=True, fastmath=FM, cache=True)
def scan_float64_state(x, delta, A, B, C, D, y, h_last, ckpt, chunk):
    """The exercise asks the state in x's dtype; this one keeps it in float64 always."""
    nb, L, Dm = x.shape
    N = A.shape[1]
    for pair in prange(nb * Dm):
        b, d = pair // Dm, pair % Dm
        h = np.zeros(N, np.float64)
        for t in range(L):
            if t % chunk == 0:
                for n in range(N):
                    ckpt[b, t // chunk, d, n] = h[n]
            s = D[d] * x[b, t, d]
            for n in range(N):
                h[n] = math.exp(delta[b, t, d] * A[d, n]) * h[n] + delta[b, t, d] * x[b, t, d] * B[b, t, n]
                s += C[b, t, n] * h[n]
            y[b, t, d] = s
        for n in range(N):
            h_last[b, d, n] = h[n]


@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_serial(q, k, v, out, lse, scale, causal, BQ, BK):
    """Right numbers, flat memory, tiles skipped; but a serial range under parallel=True."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    shift = Tk - Tq
    n_qt = (Tq + BQ - 1) // BQ
    for job in range(BH * n_qt):
        qt, h = job // BH, job % BH
        lo = qt * BQ
        hi = min(Tq, lo + BQ)
        rows = hi - lo
        run_max = np.empty(rows, q.dtype)
        run_sum = np.empty(rows, q.dtype)
        acc = np.empty((rows, dv), q.dtype)
        s = np.empty(BK, q.dtype)
        for r in range(rows):
            run_max[r] = -np.inf
            run_sum[r] = 0
            for c in range(dv):
                acc[r, c] = 0
        kend = min(Tk, hi + shift) if causal else Tk
        for j0 in range(0, kend, BK):
            j1 = min(kend, j0 + BK)
            for r in range(rows):
                lim = min(j1, lo + r + shift + 1) if causal else j1
                if lim <= j0:
                    continue
                top = run_max[r]
                for j in range(j0, lim):
                    t = q.dtype.type(0)
                    for c in range(d):
                        t += q[h, lo + r, c] * k[h, j, c]
                    s[j - j0] = t * scale
                    if s[j - j0] > top:
                        top = s[j - j0]
                f = math.exp(run_max[r] - top)
                run_sum[r] *= f
                for c in range(dv):
                    acc[r, c] *= f
                for j in range(j0, lim):
                    w = math.exp(s[j - j0] - top)
                    run_sum[r] += w
                    for c in range(dv):
                        acc[r, c] += w * v[h, j, c]
                run_max[r] = top
        for r in range(rows):
            for c in range(dv):
                out[h, lo + r, c] = acc[r, c] / run_sum[r]
            lse[h, lo + r] = run_max[r] + math.log(run_sum[r])


@numba.njit(fastmath=FM, cache=True)
def _one_query_tile(q, k, v, out, lse, scale, causal, BQ, BK, h, lo):
    Tq, d = q.shape[1], q.shape[2]
    Tk, dv = k.shape[1], v.shape[2]
    shift = Tk - Tq
    hi = min(Tq, lo + BQ)
    rows = hi - lo
    run_max = np.full(rows, -np.inf, q.dtype)
    run_sum = np.zeros(rows, q.dtype)
    acc = np.zeros((rows, dv), q.dtype)
    s = np.empty(BK, q.dtype)
    kend = min(Tk, hi + shift) if causal else Tk
    for j0 in range(0, kend, BK):
        j1 = min(kend, j0 + BK)
        for r in range(rows):
            lim = min(j1, lo + r + shift + 1) if causal else j1
            if lim <= j0:
                continue
            top = run_max[r]
            for j in range(j0, lim):
                t = q.dtype.type(0)
                for c in range(d):
                    t += q[h, lo + r, c] * k[h, j, c]
                s[j - j0] = t * scale
                top = max(top, s[j - j0])
            f = math.exp(run_max[r] - top)
            run_sum[r] *= f
            for c in range(dv):
                acc[r, c] *= f
            for j in range(j0, lim):
                w = math.exp(s[j - j0] - top)
                run_sum[r] += w
                for c in range(dv):
                    acc[r, c] += w * v[h, j, c]
            run_max[r] = top
    for r in range(rows):
        for c in range(dv):
            out[h, lo + r, c] = acc[r, c] / run_sum[r]
        lse[h, lo + r] = run_max[r] + math.log(run_sum[r])


@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_heads_parallel(q, k, v, out, lse, scale, causal, BQ, BK):
    """Correct, another task split: prange over the heads, a head's query tiles one after another."""
    BH, Tq = q.shape[0], q.shape[1]
    for h in prange(BH):
        for lo in range(0, Tq, BQ):
            _one_query_tile(q, k, v, out, lse, scale, causal, BQ, BK, h, lo)


@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_two_pass(q, k, v, out, lse, scale, causal, BQ, BK):
    """Correct, another way to flat memory: a task per row, one pass for the max and the sum, a second (scores
    recomputed, never stored) for P V. It meets every property the exercise states: values, memory, skipped tiles."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    shift = Tk - Tq
    for job in prange(BH * Tq):
        h, i = job // Tq, job % Tq
        last = min(Tk, i + shift + 1) if causal else Tk
        top = -np.inf
        for j in range(last):
            t = q.dtype.type(0)
            for c in range(d):
                t += q[h, i, c] * k[h, j, c]
            top = max(top, t * scale)
        total = q.dtype.type(0)
        acc = np.zeros(dv, q.dtype)
        for j in range(last):
            t = q.dtype.type(0)
            for c in range(d):
                t += q[h, i, c] * k[h, j, c]
            w = math.exp(t * scale - top)
            total += w
            for c in range(dv):
                acc[c] += w * v[h, j, c]
        for c in range(dv):
            out[h, i, c] = acc[c] / total
        lse[h, i] = top + math.log(total)


@numba.njit(parallel=True, fastmath=FM, cache=True)
def ff_all_tiles_scores_only(q, k, v, out, lse, scale, causal, BQ, BK):
    """Right numbers; every key tile's scores computed (hidden keys read), only the visible ones used."""
    BH, Tq, d = q.shape
    Tk, dv = k.shape[1], v.shape[2]
    shift = Tk - Tq
    n_qt = (Tq + BQ - 1) // BQ
    for job in prange(BH * n_qt):
        qt, h = job // BH, job % BH
        lo = qt * BQ
        hi = min(Tq, lo + BQ)
        rows = hi - lo
        run_max = np.full(rows, -np.inf, q.dtype)
        run_sum = np.zeros(rows, q.dtype)
        acc = np.zeros((rows, dv), q.dtype)
        s = np.empty(BK, q.dtype)
        for j0 in range(0, Tk, BK):
            j1 = min(Tk, j0 + BK)
            for r in range(rows):
                lim = min(j1, lo + r + shift + 1) if causal else j1
                for j in range(j0, j1):                    # the tile's scores, then the mask
                    t = q.dtype.type(0)
                    for c in range(d):
                        t += q[h, lo + r, c] * k[h, j, c]
                    s[j - j0] = t * scale if j < lim else -np.inf
                if lim <= j0:
                    continue
                top = run_max[r]
                for j in range(j0, lim):
                    top = max(top, s[j - j0])
                f = math.exp(run_max[r] - top)
                run_sum[r] *= f
                for c in range(dv):
                    acc[r, c] *= f
                for j in range(j0, lim):
                    w = math.exp(s[j - j0] - top)
                    run_sum[r] += w
                    for c in range(dv):
                        acc[r, c] += w * v[h, j, c]
                run_max[r] = top
        for r in range(rows):
            for c in range(dv):
                out[h, lo + r, c] = acc[r, c] / run_sum[r]
            lse[h, lo + r] = run_max[r] + math.log(run_sum[r])


@numba.njit(parallel=True, fastmath=FM, cache=True)
def fb_no_skip_loops(q, k, v, o, do, lse, dq, dk, dv, scale, causal, BQ, BK):
    """Right numbers; every (query tile, key tile) pair visited: the tile's scores and dP computed for all its
    entries (hidden queries and keys read), hidden ones set to 0, products over the visible ones only."""
    BH, Tq, d = q.shape
    Tk, dvs = k.shape[1], v.shape[2]
    shift = Tk - Tq
    for h in prange(BH):
        Drow = np.empty(Tq, q.dtype)
        for i in range(Tq):
            t = q.dtype.type(0)
            for c in range(dvs):
                t += do[h, i, c] * o[h, i, c]
            Drow[i] = t
            for c in range(d):
                dq[h, i, c] = 0
        for j in range(Tk):
            for c in range(d):
                dk[h, j, c] = 0
            for c in range(dvs):
                dv[h, j, c] = 0
        P = np.empty((BQ, BK), q.dtype)
        dS = np.empty((BQ, BK), q.dtype)
        for i0 in range(0, Tq, BQ):
            nq = min(BQ, Tq - i0)
            for j0 in range(0, Tk, BK):
                nk = min(BK, Tk - j0)
                for i in range(nq):
                    for j in range(nk):
                        t = q.dtype.type(0)
                        for c in range(d):
                            t += q[h, i0 + i, c] * k[h, j0 + j, c]
                        dp = q.dtype.type(0)
                        for c in range(dvs):
                            dp += do[h, i0 + i, c] * v[h, j0 + j, c]
                        if causal and j0 + j > i0 + i + shift:
                            P[i, j] = 0
                            dS[i, j] = 0
                        else:
                            P[i, j] = math.exp(t * scale - lse[h, i0 + i])
                            dS[i, j] = P[i, j] * (dp - Drow[i0 + i]) * scale
                for i in range(nq):
                    for j in range(nk):
                        if causal and j0 + j > i0 + i + shift:
                            continue
                        for c in range(dvs):
                            dv[h, j0 + j, c] += P[i, j] * do[h, i0 + i, c]
                        for c in range(d):
                            dk[h, j0 + j, c] += dS[i, j] * q[h, i0 + i, c]
                            dq[h, i0 + i, c] += dS[i, j] * k[h, j0 + j, c]


# ---------------------------------------------------------------- chapter 10's cases

ACCEPT_10 = [
    case("ff_two_pass_recomputed", ch10.flash_forward, ff_two_pass, slow_case=True),
    case("ff_heads_parallel", ch10.flash_forward, ff_heads_parallel, slow_case=True),
    case("online_update_rows", ch10.online_softmax_update, online_update_rows),
    case("scan_channels_outer", ch10.fused_scan, scan_channels_outer, slow_case=True),
    case("flash_forward_rowwise_online", ch10.flash_forward, ff_rowwise_online, slow_case=True),
    case("flash_backward_two_sweeps", ch10.flash_backward, fb_two_sweeps, slow_case=True),
    case("attention_op_functional", ch10.attention_op, register_attention_functional, slow_case=True),
]

REJECT_10 = [
    case("scan_serial", ch10.fused_scan, scan_serial, slow_case=True),
    case("scan_float64_state", ch10.fused_scan, scan_float64_state, slow_case=True),
    case("ff_serial", ch10.flash_forward, ff_serial, slow_case=True),
    case("ff_all_tiles_scores_only", ch10.flash_forward, ff_all_tiles_scores_only, slow_case=True),
    case("fb_no_skip_loops", ch10.flash_backward, fb_no_skip_loops, slow_case=True),
    case("online_no_rescale", ch10.online_softmax_update, online_no_rescale),
    case("online_rescale_l_only", ch10.online_softmax_update, online_rescale_l_only),
    case("online_exp_then_shift", ch10.online_softmax_update, online_exp_then_shift),
    case("scan_keeps_history", ch10.fused_scan, scan_keeps_history, slow_case=True),
    case("scan_ckpt_after_step", ch10.fused_scan, scan_ckpt_after_step, slow_case=True),
    case("ff_whole_row", ch10.flash_forward, ff_whole_row, slow_case=True),
    case("ff_max_from_zero", ch10.flash_forward, ff_max_from_zero, slow_case=True),
    case("ff_all_tiles_weight_zero", ch10.flash_forward, ff_all_tiles_weight_zero, slow_case=True),
    case("ff_square_mask", ch10.flash_forward, ff_square_mask, slow_case=True),
    case("fb_stores_P", ch10.flash_backward, fb_stores_P, slow_case=True),
    case("fb_no_skip_matmul", ch10.flash_backward, fb_no_skip_matmul, slow_case=True),
    case("fb_dq_not_zeroed", ch10.flash_backward, fb_dq_not_zeroed, slow_case=True),
    case("fb_dk_unscaled", ch10.flash_backward, fb_dk_unscaled, slow_case=True),
    case("op_numpy_backward", ch10.attention_op, register_attention_numpy_backward),
    case("op_empty_like", ch10.attention_op, register_attention_empty_like),
]


# ==================================================================================================
# Chapter 11: distributed training
# ==================================================================================================

# ---------------------------------------------------------------- 1. ring all-reduce

def ring_shifted_start(tensor):
    """Correct, another schedule: every rank starts two chunks further on; both messages posted at once."""
    rank, p = dist.get_rank(), dist.get_world_size()
    parts = torch.tensor_split(tensor.view(-1), p)
    right, left = (rank + 1) % p, (rank - 1) % p
    for step in range(p - 1):                       # reduce-scatter
        give, take = parts[(rank + 2 - step) % p], parts[(rank + 1 - step) % p]
        inbox = torch.empty_like(take)
        works = [dist.isend(give, right), dist.irecv(inbox, left)]
        for w in works:
            w.wait()
        take += inbox
    for step in range(p - 1):                       # all-gather, from the chunk this rank finished
        give, take = parts[(rank + 3 - step) % p], parts[(rank + 2 - step) % p]
        inbox = torch.empty_like(take)
        works = [dist.isend(give, right), dist.irecv(inbox, left)]
        for w in works:
            w.wait()
        take.copy_(inbox)
    return tensor


def ring_whole_tensor(tensor):
    """Right sums, by neighbours only, but the whole tensor travels at every step: p - 1 messages of n numbers."""
    rank, p = dist.get_rank(), dist.get_world_size()
    passing = tensor.clone()
    total = tensor.clone()
    for _ in range(p - 1):
        inbox = torch.empty_like(passing)
        send = dist.isend(passing, (rank + 1) % p)
        dist.recv(inbox, (rank - 1) % p)
        send.wait()
        total += inbox
        passing = inbox
    tensor.copy_(total)
    return tensor


def ring_collective(tensor):
    """Right sums, no ring: the library's all-reduce."""
    dist.all_reduce(tensor)
    return tensor


def ring_gather_adds(tensor):
    """Wrong: the all-gather adds what arrives instead of overwriting."""
    me, size = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor.view(-1), size)
    for phase in range(2):
        for s in range(size - 1):
            outgoing = chunks[(me - s + phase) % size]
            target = chunks[(me - s - 1 + phase) % size]
            buf = torch.empty_like(target)
            sending = dist.isend(outgoing, dst=(me + 1) % size)
            dist.recv(buf, src=(me - 1) % size)
            sending.wait()
            target.add_(buf)
    return tensor


def ring_on_a_copy(tensor):
    """Wrong: cuts a flattened copy (reshape of a contiguous tensor is a view, so clone makes the copy)."""
    me, size = dist.get_rank(), dist.get_world_size()
    work = tensor.clone().view(-1)
    chunks = torch.tensor_split(work, size)
    for phase in range(2):
        for s in range(size - 1):
            outgoing = chunks[(me - s + phase) % size]
            target = chunks[(me - s - 1 + phase) % size]
            buf = torch.empty_like(target)
            sending = dist.isend(outgoing, dst=(me + 1) % size)
            dist.recv(buf, src=(me - 1) % size)
            sending.wait()
            if phase == 0:
                target.add_(buf)
            else:
                target.copy_(buf)
    return work.view_as(tensor)


# ---------------------------------------------------------------- 2. DDP

class DDPCounters(nn.Module):
    """Correct, written differently: a countdown per bucket, a cursor for the next bucket to send, hooks as
    closures, nested no_sync, the mean taken per parameter."""

    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for p in self.module.parameters():
                dist.broadcast(p.data, 0)
        trainable = [p for p in self.module.parameters() if p.requires_grad]
        self.buckets = [[]]
        size = 0
        for p in reversed(trainable):
            if size >= bucket_bytes and self.buckets[-1]:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * p.element_size()
        self.bucket_of = {}
        for b, members in enumerate(self.buckets):
            for p in members:
                self.bucket_of[p] = b
        self.silent = 0
        self.reset()
        for p in trainable:
            p.register_post_accumulate_grad_hook(lambda param: self.landed(param))

    def reset(self):
        self.missing = [len(b) for b in self.buckets]
        self.cursor = 0
        self.inflight = []

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def landed(self, param):
        if self.silent:
            return
        self.missing[self.bucket_of[param]] -= 1
        while self.cursor < len(self.buckets) and self.missing[self.cursor] == 0:
            members = self.buckets[self.cursor]
            flat = torch.cat([p.grad.flatten() for p in members])
            self.inflight.append((members, flat, dist.all_reduce(flat, async_op=True)))
            self.cursor += 1

    def finish(self):
        p_count = dist.get_world_size()
        for members, flat, work in self.inflight:
            work.wait()
            at = 0
            for p in members:
                p.grad.copy_(flat[at:at + p.numel()].view_as(p.grad) / p_count)
                at += p.numel()
        self.reset()

    @contextlib.contextmanager
    def no_sync(self):
        self.silent += 1
        try:
            yield
        finally:
            self.silent -= 1


class DDPSendInFinish(nn.Module):
    """Right numbers; every bucket is sent by finish(), after the backward: no overlap."""

    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for t in module.parameters():
                dist.broadcast(t, src=0)
        self.groups, group, nbytes = [], [], 0
        for t in reversed(list(module.parameters())):
            group.append(t)
            nbytes += t.numel() * t.element_size()
            if nbytes >= bucket_bytes:
                self.groups.append(group)
                group, nbytes = [], 0
        if group:
            self.groups.append(group)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def landed(self, param):
        pass

    def finish(self):
        works = []
        for g in self.groups:
            flat = torch.cat([t.grad.reshape(-1) for t in g])
            works.append((g, flat, dist.all_reduce(flat, async_op=True)))
        for g, flat, w in works:
            w.wait()
            flat /= dist.get_world_size()
            for t, part in zip(g, flat.split([t.numel() for t in g])):
                t.grad.copy_(part.view_as(t))

    @contextlib.contextmanager
    def no_sync(self):
        yield


class DDPOnePerLanding(nn.Module):
    """Right numbers; a landing gradient releases at most one bucket (`if`, not `while`); what is left goes
    in finish()."""

    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for t in module.parameters():
                dist.broadcast(t, src=0)
        self.groups, group, nbytes = [], [], 0
        for t in reversed(list(module.parameters())):
            group.append(t)
            nbytes += t.numel() * t.element_size()
            if nbytes >= bucket_bytes:
                self.groups.append(group)
                group, nbytes = [], 0
        if group:
            self.groups.append(group)
        self.home = {t: k for k, g in enumerate(self.groups) for t in g}
        for t in module.parameters():
            t.register_post_accumulate_grad_hook(self.landed)
        self.quiet = False
        self.counts, self.pending = [0] * len(self.groups), []

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def send(self, k):
        flat = torch.cat([t.grad.reshape(-1) for t in self.groups[k]])
        self.pending.append((k, flat, dist.all_reduce(flat, async_op=True)))

    def landed(self, param):
        if self.quiet:
            return
        self.counts[self.home[param]] += 1
        k = len(self.pending)
        if k < len(self.groups) and self.counts[k] == len(self.groups[k]):
            self.send(k)

    def finish(self):
        while len(self.pending) < len(self.groups):
            self.send(len(self.pending))
        for k, flat, work in self.pending:
            work.wait()
            flat /= dist.get_world_size()
            for t, mean in zip(self.groups[k], flat.split([t.numel() for t in self.groups[k]])):
                t.grad.copy_(mean.view_as(t))
        self.counts, self.pending = [0] * len(self.groups), []

    @contextlib.contextmanager
    def no_sync(self):
        self.quiet = True
        try:
            yield
        finally:
            self.quiet = False


class DDPStrictlyAbove(nn.Module):
    """Right numbers; a bucket closes only strictly above bucket_bytes."""

    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for t in module.parameters():
                dist.broadcast(t, src=0)
        self.groups, group, nbytes = [], [], 0
        for t in reversed(list(module.parameters())):
            group.append(t)
            nbytes += t.numel() * t.element_size()
            if nbytes > bucket_bytes:
                self.groups.append(group)
                group, nbytes = [], 0
        if group:
            self.groups.append(group)
        self.home = {t: k for k, g in enumerate(self.groups) for t in g}
        for t in module.parameters():
            t.register_post_accumulate_grad_hook(self.landed)
        self.quiet = False
        self.counts, self.pending = [0] * len(self.groups), []

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def landed(self, param):
        if self.quiet:
            return
        self.counts[self.home[param]] += 1
        k = len(self.pending)
        while k < len(self.groups) and self.counts[k] == len(self.groups[k]):
            flat = torch.cat([t.grad.reshape(-1) for t in self.groups[k]])
            self.pending.append((k, flat, dist.all_reduce(flat, async_op=True)))
            k += 1

    def finish(self):
        for k, flat, work in self.pending:
            work.wait()
            flat /= dist.get_world_size()
            for t, mean in zip(self.groups[k], flat.split([t.numel() for t in self.groups[k]])):
                t.grad.copy_(mean.view_as(t))
        self.counts, self.pending = [0] * len(self.groups), []

    @contextlib.contextmanager
    def no_sync(self):
        self.quiet = True
        try:
            yield
        finally:
            self.quiet = False


class DDPNoSyncStillCounts(nn.Module):
    """Wrong: under no_sync the hooks still count (only the sending is skipped), so the counts run ahead."""

    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for t in module.parameters():
                dist.broadcast(t, src=0)
        self.groups, group, nbytes = [], [], 0
        for t in reversed(list(module.parameters())):
            group.append(t)
            nbytes += t.numel() * t.element_size()
            if nbytes >= bucket_bytes:
                self.groups.append(group)
                group, nbytes = [], 0
        if group:
            self.groups.append(group)
        self.home = {t: k for k, g in enumerate(self.groups) for t in g}
        for t in module.parameters():
            t.register_post_accumulate_grad_hook(self.landed)
        self.quiet = False
        self.counts, self.pending = [0] * len(self.groups), []

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def landed(self, param):
        self.counts[self.home[param]] += 1
        if self.quiet:
            return
        k = len(self.pending)
        while k < len(self.groups) and self.counts[k] >= len(self.groups[k]):
            flat = torch.cat([t.grad.reshape(-1) for t in self.groups[k]])
            self.pending.append((k, flat, dist.all_reduce(flat, async_op=True)))
            k += 1

    def finish(self):
        for k, flat, work in self.pending:
            work.wait()
            flat /= dist.get_world_size()
            for t, mean in zip(self.groups[k], flat.split([t.numel() for t in self.groups[k]])):
                t.grad.copy_(mean.view_as(t))
        self.counts, self.pending = [0] * len(self.groups), []

    @contextlib.contextmanager
    def no_sync(self):
        self.quiet = True
        try:
            yield
        finally:
            self.quiet = False


class DDPNoBroadcast(nn.Module):
    """Wrong: never copies rank 0's parameters."""

    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module = module
        self.groups, group, nbytes = [], [], 0
        for t in reversed(list(module.parameters())):
            group.append(t)
            nbytes += t.numel() * t.element_size()
            if nbytes >= bucket_bytes:
                self.groups.append(group)
                group, nbytes = [], 0
        if group:
            self.groups.append(group)
        self.home = {t: k for k, g in enumerate(self.groups) for t in g}
        for t in module.parameters():
            t.register_post_accumulate_grad_hook(self.landed)
        self.quiet = False
        self.counts, self.pending = [0] * len(self.groups), []

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def landed(self, param):
        if self.quiet:
            return
        self.counts[self.home[param]] += 1
        k = len(self.pending)
        while k < len(self.groups) and self.counts[k] == len(self.groups[k]):
            flat = torch.cat([t.grad.reshape(-1) for t in self.groups[k]])
            self.pending.append((k, flat, dist.all_reduce(flat, async_op=True)))
            k += 1

    def finish(self):
        for k, flat, work in self.pending:
            work.wait()
            flat /= dist.get_world_size()
            for t, mean in zip(self.groups[k], flat.split([t.numel() for t in self.groups[k]])):
                t.grad.copy_(mean.view_as(t))
        self.counts, self.pending = [0] * len(self.groups), []

    @contextlib.contextmanager
    def no_sync(self):
        self.quiet = True
        try:
            yield
        finally:
            self.quiet = False


# ---------------------------------------------------------------- 3. ZeRO-1

class ZeroWholeTensors:
    """Correct, another sharding: whole tensors dealt out, each to the least-loaded rank; the owner steps its
    tensors in place with an optimizer of its own, then broadcasts each one."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = [t for t in params if t.requires_grad]
        load = [0] * dist.get_world_size()
        self.owner = []
        for t in self.params:
            r = min(range(len(load)), key=lambda j: (load[j], j))
            self.owner.append(r)
            load[r] += t.numel()
        mine = [t for t, r in zip(self.params, self.owner) if r == dist.get_rank()]
        self.optimizer = optimizer_class(mine, **defaults) if mine else None

    def zero_grad(self):
        for t in self.params:
            t.grad = None

    @torch.no_grad()
    def step(self):
        if self.optimizer is not None:
            self.optimizer.step()
        for t, r in zip(self.params, self.owner):
            dist.broadcast(t, src=r)


class ZeroSplitEvenly:
    """Correct, flat shards cut as tensor_split cuts (sizes differ by at most one), padded for all_gather."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = [t for t in params if t.requires_grad]
        p, r = dist.get_world_size(), dist.get_rank()
        total = sum(t.numel() for t in self.params)
        base, extra = divmod(total, p)
        self.sizes = [base + (1 if i < extra else 0) for i in range(p)]
        self.lo = sum(self.sizes[:r])
        self.hi = self.lo + self.sizes[r]
        with torch.no_grad():
            flat = torch.cat([t.detach().flatten() for t in self.params])
        self.shard = nn.Parameter(flat[self.lo:self.hi].clone())
        self.optimizer = optimizer_class([self.shard], **defaults)

    def zero_grad(self):
        for t in self.params:
            t.grad = None

    @torch.no_grad()
    def step(self):
        grads = torch.cat([t.grad.flatten() for t in self.params])
        self.shard.grad = grads[self.lo:self.hi].clone()
        self.optimizer.step()
        width = max(self.sizes)
        mine = torch.zeros(width, dtype=self.shard.dtype)
        mine[:self.hi - self.lo] = self.shard
        pieces = [torch.empty_like(mine) for _ in self.sizes]
        dist.all_gather(pieces, mine)
        flat = torch.cat([piece[:n] for piece, n in zip(pieces, self.sizes)])
        at = 0
        for t in self.params:
            t.copy_(flat[at:at + t.numel()].view_as(t))
            at += t.numel()


class ZeroEveryoneEverything:
    """Right numbers; every rank keeps the whole optimizer over every parameter."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = [t for t in params if t.requires_grad]
        self.optimizer = optimizer_class(self.params, **defaults)

    def zero_grad(self):
        for t in self.params:
            t.grad = None

    @torch.no_grad()
    def step(self):
        self.optimizer.step()


class ZeroUntrimmedGather:
    """Wrong: shards of tensor_split's sizes, padded for all_gather, and the padding kept when concatenated."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = [t for t in params if t.requires_grad]
        p, r = dist.get_world_size(), dist.get_rank()
        total = sum(t.numel() for t in self.params)
        base, extra = divmod(total, p)
        self.sizes = [base + (1 if i < extra else 0) for i in range(p)]
        self.lo = sum(self.sizes[:r])
        self.hi = self.lo + self.sizes[r]
        with torch.no_grad():
            flat = torch.cat([t.detach().flatten() for t in self.params])
        self.shard = nn.Parameter(flat[self.lo:self.hi].clone())
        self.optimizer = optimizer_class([self.shard], **defaults)

    def zero_grad(self):
        for t in self.params:
            t.grad = None

    @torch.no_grad()
    def step(self):
        grads = torch.cat([t.grad.flatten() for t in self.params])
        self.shard.grad = grads[self.lo:self.hi].clone()
        self.optimizer.step()
        width = max(self.sizes)
        mine = torch.zeros(width, dtype=self.shard.dtype)
        mine[:self.hi - self.lo] = self.shard
        pieces = [torch.empty_like(mine) for _ in self.sizes]
        dist.all_gather(pieces, mine)
        flat = torch.cat(pieces)
        at = 0
        for t in self.params:
            t.copy_(flat[at:at + t.numel()].view_as(t))
            at += t.numel()


# ---------------------------------------------------------------- 4. f and g

class CopyToParallelClone(torch.autograd.Function):
    """Correct, with copies: forward hands a copy on, backward sums a copy."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        total = torch.empty_like(grad)
        total.copy_(grad)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total


class ReduceFromParallelClone(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        total = x + 0
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad.clone()


class CopyInPlaceBackward(torch.autograd.Function):
    """Wrong: sums the incoming gradient in place."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        dist.all_reduce(grad)
        return grad


class ReduceInPlaceForward(torch.autograd.Function):
    """Wrong: sums the tensor it is handed, in place."""

    @staticmethod
    def forward(ctx, x):
        dist.all_reduce(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class ReduceTwice(torch.autograd.Function):
    """Wrong: g sums in backward too."""

    @staticmethod
    def forward(ctx, x):
        total = x.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        total = grad.clone()
        dist.all_reduce(total)
        return total


class CopyIdentityBoth(torch.autograd.Function):
    """Wrong: f as the identity both ways."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


# the names the tensor-parallel MLP reads (correct f and g)
class CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        total = grad.clone()
        dist.all_reduce(total)
        return total


class ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        total = x.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


# ---------------------------------------------------------------- 5. tensor-parallel MLP

class ParallelMLPParams(nn.Module):
    """Correct, written differently: the rank's bounds by divmod, the slices as Parameters, F.linear."""

    def __init__(self, mlp):
        super().__init__()
        hidden = mlp.c_fc.weight.shape[0]
        p, r = dist.get_world_size(), dist.get_rank()
        base, extra = divmod(hidden, p)
        lo = r * base + min(r, extra)
        hi = lo + base + (1 if r < extra else 0)
        self.w_in = nn.Parameter(mlp.c_fc.weight.detach()[lo:hi].clone())
        self.b_in = nn.Parameter(mlp.c_fc.bias.detach()[lo:hi].clone())
        self.w_out = nn.Parameter(mlp.c_proj.weight.detach()[:, lo:hi].clone())
        self.b_out = nn.Parameter(mlp.c_proj.bias.detach().clone())
        self.dropout = mlp.dropout

    def forward(self, x):
        x = CopyToParallel.apply(x)
        hidden = F.gelu(F.linear(x, self.w_in, self.b_in), approximate="tanh")
        partial = F.linear(hidden, self.w_out)
        return self.dropout(ReduceFromParallel.apply(partial) + self.b_out)


class ParallelMLPLinears(nn.Module):
    """Correct, written differently, with the contract's names: bounds by divmod, the slices handed to fresh
    nn.Linear layers as new Parameters, c_proj applied as F.linear without its bias, the bias after g."""

    def __init__(self, mlp):
        super().__init__()
        hidden = mlp.c_fc.weight.shape[0]
        p, r = dist.get_world_size(), dist.get_rank()
        base, extra = divmod(hidden, p)
        lo = r * base + min(r, extra)
        hi = lo + base + (1 if r < extra else 0)
        dt = mlp.c_fc.weight.dtype
        self.c_fc = nn.Linear(mlp.c_fc.in_features, hi - lo, dtype=dt)
        self.c_proj = nn.Linear(hi - lo, mlp.c_proj.out_features, dtype=dt)
        self.c_fc.weight = nn.Parameter(mlp.c_fc.weight.detach()[lo:hi].clone())
        self.c_fc.bias = nn.Parameter(mlp.c_fc.bias.detach()[lo:hi].clone())
        self.c_proj.weight = nn.Parameter(mlp.c_proj.weight.detach()[:, lo:hi].clone())
        self.c_proj.bias = nn.Parameter(mlp.c_proj.bias.detach().clone())
        self.dropout = mlp.dropout

    def forward(self, x):
        hidden = F.gelu(self.c_fc(CopyToParallel.apply(x)), approximate="tanh")
        total = ReduceFromParallel.apply(F.linear(hidden, self.c_proj.weight))
        return self.dropout(total + self.c_proj.bias)


class ParallelMLPBiasEveryRank(nn.Module):
    """Wrong: c_proj's bias added before the sum."""

    def __init__(self, mlp):
        super().__init__()
        lo_hi = torch.arange(mlp.c_fc.out_features).tensor_split(dist.get_world_size())[dist.get_rank()]
        lo, hi = int(lo_hi[0]), int(lo_hi[-1]) + 1
        kind = mlp.c_fc.weight.dtype
        self.c_fc = nn.Linear(mlp.c_fc.in_features, hi - lo, dtype=kind)
        self.c_proj = nn.Linear(hi - lo, mlp.c_proj.out_features, dtype=kind)
        with torch.no_grad():
            self.c_fc.weight.copy_(mlp.c_fc.weight[lo:hi])
            self.c_fc.bias.copy_(mlp.c_fc.bias[lo:hi])
            self.c_proj.weight.copy_(mlp.c_proj.weight[:, lo:hi])
            self.c_proj.bias.copy_(mlp.c_proj.bias)
        self.dropout = mlp.dropout

    def forward(self, x):
        h = F.gelu(self.c_fc(CopyToParallel.apply(x)), approximate="tanh")
        return self.dropout(ReduceFromParallel.apply(self.c_proj(h)))


class ParallelMLPNoF(nn.Module):
    """Wrong: x enters without f, so its gradient misses the other ranks' part."""

    def __init__(self, mlp):
        super().__init__()
        lo_hi = torch.arange(mlp.c_fc.out_features).tensor_split(dist.get_world_size())[dist.get_rank()]
        lo, hi = int(lo_hi[0]), int(lo_hi[-1]) + 1
        kind = mlp.c_fc.weight.dtype
        self.c_fc = nn.Linear(mlp.c_fc.in_features, hi - lo, dtype=kind)
        self.c_proj = nn.Linear(hi - lo, mlp.c_proj.out_features, dtype=kind)
        with torch.no_grad():
            self.c_fc.weight.copy_(mlp.c_fc.weight[lo:hi])
            self.c_fc.bias.copy_(mlp.c_fc.bias[lo:hi])
            self.c_proj.weight.copy_(mlp.c_proj.weight[:, lo:hi])
            self.c_proj.bias.copy_(mlp.c_proj.bias)
        self.dropout = mlp.dropout

    def forward(self, x):
        h = F.gelu(self.c_fc(x), approximate="tanh")
        return self.dropout(ReduceFromParallel.apply(h @ self.c_proj.weight.T) + self.c_proj.bias)


class ParallelMLPCeilSlices(nn.Module):
    """Wrong: slices of ceil(4C / p), not tensor_split's."""

    def __init__(self, mlp):
        super().__init__()
        width = mlp.c_fc.out_features
        size = math.ceil(width / dist.get_world_size())
        lo = min(width, dist.get_rank() * size)
        hi = min(width, lo + size)
        kind = mlp.c_fc.weight.dtype
        self.c_fc = nn.Linear(mlp.c_fc.in_features, hi - lo, dtype=kind)
        self.c_proj = nn.Linear(hi - lo, mlp.c_proj.out_features, dtype=kind)
        with torch.no_grad():
            self.c_fc.weight.copy_(mlp.c_fc.weight[lo:hi])
            self.c_fc.bias.copy_(mlp.c_fc.bias[lo:hi])
            self.c_proj.weight.copy_(mlp.c_proj.weight[:, lo:hi])
            self.c_proj.bias.copy_(mlp.c_proj.bias)
        self.dropout = mlp.dropout

    def forward(self, x):
        h = F.gelu(self.c_fc(CopyToParallel.apply(x)), approximate="tanh")
        return self.dropout(ReduceFromParallel.apply(h @ self.c_proj.weight.T) + self.c_proj.bias)


class ParallelMLPWholeOnEveryRank(nn.Module):
    """Right output and gradient of x, no parallelism: every rank keeps and runs the whole MLP; the slices
    are there, unused."""

    def __init__(self, mlp):
        super().__init__()
        lo_hi = torch.arange(mlp.c_fc.out_features).tensor_split(dist.get_world_size())[dist.get_rank()]
        lo, hi = int(lo_hi[0]), int(lo_hi[-1]) + 1
        kind = mlp.c_fc.weight.dtype
        self.c_fc = nn.Linear(mlp.c_fc.in_features, hi - lo, dtype=kind)
        self.c_proj = nn.Linear(hi - lo, mlp.c_proj.out_features, dtype=kind)
        with torch.no_grad():
            self.c_fc.weight.copy_(mlp.c_fc.weight[lo:hi])
            self.c_fc.bias.copy_(mlp.c_fc.bias[lo:hi])
            self.c_proj.weight.copy_(mlp.c_proj.weight[:, lo:hi])
            self.c_proj.bias.copy_(mlp.c_proj.bias)
        self.register_buffer("w1", mlp.c_fc.weight.detach().clone())
        self.register_buffer("b1", mlp.c_fc.bias.detach().clone())
        self.register_buffer("w2", mlp.c_proj.weight.detach().clone())
        self.register_buffer("b2", mlp.c_proj.bias.detach().clone())
        self.dropout = mlp.dropout

    def forward(self, x):
        return self.dropout(F.linear(F.gelu(F.linear(x, self.w1, self.b1), approximate="tanh"), self.w2, self.b2))

# ---------------------------------------------------------------- more answers of the same exercises

class DDPCompletionOrder(nn.Module):
    """Wrong by the contract: sends each bucket the moment it is complete, whatever the buckets ahead of it did,
    so ranks whose gradients land in different orders would pair different buckets."""

    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for t in module.parameters():
                dist.broadcast(t, src=0)
        self.groups, group, nbytes = [], [], 0
        for t in reversed(list(module.parameters())):
            group.append(t)
            nbytes += t.numel() * t.element_size()
            if nbytes >= bucket_bytes:
                self.groups.append(group)
                group, nbytes = [], 0
        if group:
            self.groups.append(group)
        self.home = {t: k for k, g in enumerate(self.groups) for t in g}
        for t in module.parameters():
            t.register_post_accumulate_grad_hook(self.landed)
        self.quiet = False
        self.counts, self.pending = [0] * len(self.groups), []

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def landed(self, param):
        if self.quiet:
            return
        k = self.home[param]
        self.counts[k] += 1
        if self.counts[k] == len(self.groups[k]):
            flat = torch.cat([t.grad.reshape(-1) for t in self.groups[k]])
            self.pending.append((k, flat, dist.all_reduce(flat, async_op=True)))

    def finish(self):
        for k, flat, work in self.pending:
            work.wait()
            flat /= dist.get_world_size()
            for t, mean in zip(self.groups[k], flat.split([t.numel() for t in self.groups[k]])):
                t.grad.copy_(mean.view_as(t))
        self.counts, self.pending = [0] * len(self.groups), []

    @contextlib.contextmanager
    def no_sync(self):
        self.quiet = True
        try:
            yield
        finally:
            self.quiet = False


class ZeroGradMasked:
    """Correct, another way: one optimizer over every parameter, but each rank hands it gradients only for the
    tensors it owns (round robin); torch optimizers make state lazily, only for tensors with a gradient."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = [t for t in params if t.requires_grad]
        self.owner = [i % dist.get_world_size() for i in range(len(self.params))]
        self.optimizer = optimizer_class(self.params, **defaults)

    def zero_grad(self):
        for t in self.params:
            t.grad = None

    @torch.no_grad()
    def step(self):
        me = dist.get_rank()
        kept = [t.grad for t in self.params]
        for t, r in zip(self.params, self.owner):
            if r != me:
                t.grad = None
        self.optimizer.step()
        for t, g in zip(self.params, kept):
            t.grad = g
        for t, r in zip(self.params, self.owner):
            dist.broadcast(t, src=r)


# ---------------------------------------------------------------- chapter 11's cases

ACCEPT_11 = [
    case("zero_grad_masked", ch11.zero_optimizer, ZeroGradMasked, slow_case=True),
    case("ring_shifted_start", ch11.ring_all_reduce, ring_shifted_start),
    case("ddp_counters", ch11.ddp, DDPCounters),
    case("zero_whole_tensors", ch11.zero_optimizer, ZeroWholeTensors),
    case("zero_split_evenly", ch11.zero_optimizer, ZeroSplitEvenly, slow_case=True),
    case("f_and_g_clones", ch11.f_and_g, CopyToParallelClone, ReduceFromParallelClone),
    case("parallel_mlp_linears", ch11.parallel_mlp, ParallelMLPLinears),
]

REJECT_11 = [
    case("ddp_completion_order", ch11.ddp, DDPCompletionOrder),
    case("ring_whole_tensor", ch11.ring_all_reduce, ring_whole_tensor),
    case("ring_collective", ch11.ring_all_reduce, ring_collective, slow_case=True),
    case("ring_gather_adds", ch11.ring_all_reduce, ring_gather_adds, slow_case=True),
    case("ring_on_a_copy", ch11.ring_all_reduce, ring_on_a_copy, slow_case=True),
    case("ddp_send_in_finish", ch11.ddp, DDPSendInFinish, slow_case=True),
    case("ddp_one_per_landing", ch11.ddp, DDPOnePerLanding),
    case("ddp_strictly_above", ch11.ddp, DDPStrictlyAbove, slow_case=True),
    case("ddp_no_sync_counts", ch11.ddp, DDPNoSyncStillCounts, slow_case=True),
    case("ddp_no_broadcast", ch11.ddp, DDPNoBroadcast, slow_case=True),
    case("zero_everything", ch11.zero_optimizer, ZeroEveryoneEverything),
    case("zero_untrimmed", ch11.zero_optimizer, ZeroUntrimmedGather, slow_case=True),
    case("f_in_place_backward", ch11.f_and_g, CopyInPlaceBackward, ReduceFromParallel, slow_case=True),
    case("g_in_place_forward", ch11.f_and_g, CopyToParallel, ReduceInPlaceForward, slow_case=True),
    case("g_reduces_twice", ch11.f_and_g, CopyToParallel, ReduceTwice, slow_case=True),
    case("f_identity", ch11.f_and_g, CopyIdentityBoth, ReduceFromParallel),
    case("mlp_bias_every_rank", ch11.parallel_mlp, ParallelMLPBiasEveryRank, slow_case=True),
    case("mlp_no_f", ch11.parallel_mlp, ParallelMLPNoF),
    case("mlp_ceil_slices", ch11.parallel_mlp, ParallelMLPCeilSlices, slow_case=True),
    case("mlp_not_the_contract_names", ch11.parallel_mlp, ParallelMLPParams, slow_case=True),
    case("mlp_whole_on_every_rank", ch11.parallel_mlp, ParallelMLPWholeOnEveryRank, slow_case=True),
]


# ==================================================================================================
# Chapter 12: the capstone
# ==================================================================================================

C_GELU, K_GELU = math.sqrt(2.0 / math.pi), 0.044715


# ---------------------------------------------------------------- 1. softmax

class SoftmaxSaved(Function):
    """Correct: the output through save_for_backward, the division as a product, the backward expanded."""

    @staticmethod
    def forward(ctx, a, dim):
        with no_grad():
            shifted = a.detach() - a.detach().max(dim, keepdim=True)
            e = shifted.exp()
            s = e * (1.0 / e.sum(dim, keepdim=True))
        ctx.save_for_backward(s)
        ctx.dim = dim
        return s.data

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        sg = s * grad
        return sg - s * sg.sum(ctx.dim, keepdim=True)


class SoftmaxRecords(Function):
    """Right numbers; the forward's ops are recorded (no no_grad)."""

    @staticmethod
    def forward(ctx, a, dim):
        e = (a - a.max(dim, keepdim=True)).exp()
        ctx.s, ctx.dim = e / e.sum(dim, keepdim=True), dim
        return ctx.s.data

    @staticmethod
    def backward(ctx, grad):
        s = ctx.s.detach()
        return s * (grad - (grad * s).sum(ctx.dim, keepdim=True))


class SoftmaxKeepsExp(Function):
    """Right numbers; keeps the exponentials and the output: two arrays of the input's size."""

    @staticmethod
    def forward(ctx, a, dim):
        with no_grad():
            e = (a - a.max(dim, keepdim=True)).exp()
            z = e.sum(dim, keepdim=True)
            ctx.e, ctx.z, ctx.s, ctx.dim = e, z, e / z, dim
        return ctx.s.data

    @staticmethod
    def backward(ctx, grad):
        s = ctx.s
        return s * (grad - (grad * s).sum(ctx.dim, keepdim=True))


class SoftmaxLogSoftmaxRule(Function):
    """Wrong: the backward of log-softmax."""

    @staticmethod
    def forward(ctx, a, dim):
        with no_grad():
            e = (a - a.max(dim, keepdim=True)).exp()
            ctx.s, ctx.dim = e / e.sum(dim, keepdim=True), dim
        return ctx.s.data

    @staticmethod
    def backward(ctx, grad):
        return grad - ctx.s * grad.sum(ctx.dim, keepdim=True)


class SoftmaxNoShift(Function):
    """Wrong: no max subtracted."""

    @staticmethod
    def forward(ctx, a, dim):
        with no_grad():
            e = a.detach().exp()
            ctx.s, ctx.dim = e / e.sum(dim, keepdim=True), dim
        return ctx.s.data

    @staticmethod
    def backward(ctx, grad):
        s = ctx.s
        return s * (grad - (grad * s).sum(ctx.dim, keepdim=True))


# ---------------------------------------------------------------- 2. GELU

class GELUKeepsTanh(Function):
    """Correct, the tanh form: keeps the input and tanh(u), one array."""

    @staticmethod
    def forward(ctx, a):
        with no_grad():
            x = a.detach()
            t = (C_GELU * (x + K_GELU * x * x * x)).tanh()
            ctx.x, ctx.t = x, t
            return (0.5 * x * (1.0 + t)).data

    @staticmethod
    def backward(ctx, grad):
        x, t = ctx.x, ctx.t
        du = C_GELU * (1.0 + 3.0 * K_GELU * x * x)
        return grad * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)


class GELURecomputes(Function):
    """Correct: keeps only the input and recomputes tanh in the backward."""

    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        with no_grad():
            x = a.detach()
            return (0.5 * x * (1.0 + (C_GELU * (x + K_GELU * x ** 3)).tanh())).data

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        x = a.detach()
        t = (C_GELU * (x + K_GELU * x ** 3)).tanh()
        return grad * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * C_GELU * (1.0 + 3.0 * K_GELU * x * x))


class GELUKeepsEverything(Function):
    """Right numbers; keeps x^2, x^3, u, tanh u and 1 - tanh^2: five arrays."""

    @staticmethod
    def forward(ctx, a):
        with no_grad():
            x = a.detach()
            x2 = x * x
            x3 = x2 * x
            u = C_GELU * (x + K_GELU * x3)
            t = u.tanh()
            sech2 = 1.0 - t * t
            ctx.x, ctx.x2, ctx.x3, ctx.u, ctx.t, ctx.sech2 = x, x2, x3, u, t, sech2
            return (0.5 * x * (1.0 + t)).data

    @staticmethod
    def backward(ctx, grad):
        return grad * (0.5 * (1.0 + ctx.t) + 0.5 * ctx.x * ctx.sech2 * C_GELU * (1.0 + 3.0 * K_GELU * ctx.x2))


class GELURecords(Function):
    """Right numbers; the forward's ops are recorded."""

    @staticmethod
    def forward(ctx, a):
        t = (C_GELU * (a + K_GELU * a * a * a)).tanh()
        ctx.x, ctx.t = a.detach(), t.detach()
        return (0.5 * a * (1.0 + t)).data

    @staticmethod
    def backward(ctx, grad):
        x, t = ctx.x, ctx.t
        return grad * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * C_GELU * (1.0 + 3.0 * K_GELU * x * x))


class GELUHalfOnce(Function):
    """Wrong: the half multiplies only the first term of the product rule."""

    @staticmethod
    def forward(ctx, a):
        with no_grad():
            x = a.detach()
            t = (C_GELU * (x + K_GELU * x * x * x)).tanh()
            ctx.x, ctx.t = x, t
            return (0.5 * x * (1.0 + t)).data

    @staticmethod
    def backward(ctx, grad):
        x, t = ctx.x, ctx.t
        return grad * (0.5 * (1.0 + t) + x * (1.0 - t * t) * C_GELU * (1.0 + 3.0 * K_GELU * x * x))


# ---------------------------------------------------------------- 3. layer norm

class LayerNormCentered(Function):
    """Correct: keeps the centred input and r per row (not x-hat), rebuilds x-hat in the backward."""

    @staticmethod
    def forward(ctx, a, weight, bias, eps):
        with no_grad():
            x = a.detach()
            n = x.shape[-1]
            c = x - x.sum(-1, keepdim=True) * (1.0 / n)
            var = (c * c).sum(-1, keepdim=True) * (1.0 / n)
            r = (var + eps).sqrt() ** -1.0
            ctx.c, ctx.r, ctx.w = c, r, weight.detach()
            return (c * r * ctx.w + bias.detach()).data

    @staticmethod
    def backward(ctx, grad):
        c, r, w = ctx.c, ctx.r, ctx.w
        n = c.shape[-1]
        xhat = c * r
        gx = grad * w
        d_a = (gx * n - gx.sum(-1, keepdim=True) - xhat * (gx * xhat).sum(-1, keepdim=True)) * (r * (1.0 / n))
        flat_g = grad.reshape(-1, n)
        return d_a, (flat_g * xhat.reshape(-1, n)).sum(0), flat_g.sum(0)


class LayerNormKeepsThree(Function):
    """Right numbers; keeps the centred input, x-hat and the normalized output: three arrays."""

    @staticmethod
    def forward(ctx, a, weight, bias, eps):
        with no_grad():
            x = a.detach()
            c = x - x.mean(-1, keepdim=True)
            r = 1.0 / ((c * c).mean(-1, keepdim=True) + eps).sqrt()
            xhat = c * r
            out = xhat * weight.detach() + bias.detach()
            ctx.c, ctx.xhat, ctx.out, ctx.r, ctx.w = c, xhat, out, r, weight.detach()
            return out.data

    @staticmethod
    def backward(ctx, grad):
        xhat, r, n = ctx.xhat, ctx.r, ctx.xhat.shape[-1]
        g = grad * ctx.w
        d_a = r * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
        rows = grad.reshape(-1, n)
        return d_a, (rows * xhat.reshape(-1, n)).sum(0), rows.sum(0)


class LayerNormFixedEps(Function):
    """Wrong: eps fixed at 1e-5."""

    @staticmethod
    def forward(ctx, a, weight, bias, eps):
        with no_grad():
            c = a.detach() - a.detach().mean(-1, keepdim=True)
            r = 1.0 / ((c * c).mean(-1, keepdim=True) + 1e-5).sqrt()
            ctx.xhat, ctx.r, ctx.w = c * r, r, weight.detach()
            return (ctx.xhat * ctx.w + bias.detach()).data

    @staticmethod
    def backward(ctx, grad):
        xhat, r, n = ctx.xhat, ctx.r, ctx.xhat.shape[-1]
        g = grad * ctx.w
        d_a = r * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
        rows = grad.reshape(-1, n)
        return d_a, (rows * xhat.reshape(-1, n)).sum(0), rows.sum(0)


class LayerNormNoMeanPath(Function):
    """Wrong: d_a forgets the path through the mean."""

    @staticmethod
    def forward(ctx, a, weight, bias, eps):
        with no_grad():
            c = a.detach() - a.detach().mean(-1, keepdim=True)
            r = 1.0 / ((c * c).mean(-1, keepdim=True) + eps).sqrt()
            ctx.xhat, ctx.r, ctx.w = c * r, r, weight.detach()
            return (ctx.xhat * ctx.w + bias.detach()).data

    @staticmethod
    def backward(ctx, grad):
        xhat, r, n = ctx.xhat, ctx.r, ctx.xhat.shape[-1]
        g = grad * ctx.w
        d_a = r * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        rows = grad.reshape(-1, n)
        return d_a, (rows * xhat.reshape(-1, n)).sum(0), rows.sum(0)


# ---------------------------------------------------------------- 4. embedding

class EmbeddingBincount(Function):
    """Correct: the scatter-add as one bincount per column."""

    @staticmethod
    def forward(ctx, weight, idx):
        ids = np.asarray(idx)
        ctx.ids, ctx.vocab = ids.reshape(-1), weight.shape[0]
        table = weight.data.to_numpy()
        return TensorData.from_numpy(np.take(table, ids, axis=0), weight.dtype)

    @staticmethod
    def backward(ctx, grad):
        g = grad.data.to_numpy()
        g = g.reshape(-1, g.shape[-1])
        d = np.stack([np.bincount(ctx.ids, weights=g[:, c], minlength=ctx.vocab) for c in range(g.shape[1])], axis=1)
        return Tensor(d.astype(g.dtype), dtype=grad.dtype)


class EmbeddingFancyAdd(Function):
    """Wrong: fancy += counts a repeated id once."""

    @staticmethod
    def forward(ctx, weight, idx):
        ctx.idx, ctx.rows = idx, weight.shape[0]
        return TensorData.from_numpy(weight.data.to_numpy()[idx], weight.dtype)

    @staticmethod
    def backward(ctx, grad):
        D = grad.shape[-1]
        d = np.zeros((ctx.rows, D), dtype=grad.dtype)
        d[ctx.idx.reshape(-1)] += grad.data.to_numpy().reshape(-1, D)
        return Tensor(d, dtype=grad.dtype)


class EmbeddingKeepsTable(Function):
    """Right numbers; keeps the whole table (and the gathered rows) on ctx."""

    @staticmethod
    def forward(ctx, weight, idx):
        ctx.table = weight.data.to_numpy().copy()
        ctx.idx = idx
        ctx.rows_out = ctx.table[idx]
        return TensorData.from_numpy(ctx.rows_out, weight.dtype)

    @staticmethod
    def backward(ctx, grad):
        D = grad.shape[-1]
        d = np.zeros_like(ctx.table)
        np.add.at(d, ctx.idx.reshape(-1), grad.data.to_numpy().reshape(-1, D))
        return Tensor(d, dtype=grad.dtype)


# ---------------------------------------------------------------- 5. masked fill

class MaskedFillEq(Function):
    """Correct: picks with where(mask == 0, a, value); the backward multiplies by 1 - mask."""

    @staticmethod
    def forward(ctx, a, mask, value):
        with no_grad():
            ctx.keep = 1.0 - mask.detach()
            return ct.where(mask.detach() == 0.0, a.detach(), value).data

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.keep, None


class MaskedFillArithmetic(Function):
    """Wrong: fills by arithmetic, a * (1 - mask) + mask * value (-inf * 0 = nan)."""

    @staticmethod
    def forward(ctx, a, mask, value):
        with no_grad():
            ctx.mask = mask.detach()
            return (a.detach() * (1.0 - ctx.mask) + ctx.mask * value).data

    @staticmethod
    def backward(ctx, grad):
        return ct.where(ctx.mask, 0.0, grad), None


class MaskedFillGradEverywhere(Function):
    """Wrong: the gradient reaches the filled places."""

    @staticmethod
    def forward(ctx, a, mask, value):
        with no_grad():
            return ct.where(mask.detach(), value, a.detach()).data

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class MaskedFillRecords(Function):
    """Right numbers; the forward records a where."""

    @staticmethod
    def forward(ctx, a, mask, value):
        ctx.mask = mask.detach()
        return ct.where(mask, value, a).data

    @staticmethod
    def backward(ctx, grad):
        return ct.where(ctx.mask, 0.0, grad), None


# ---------------------------------------------------------------- 6. causal attention

class AttentionAdditiveMask(Function):
    """Correct: the mask as an additive bias of 0 and -inf, the scale folded into q, the inputs saved."""

    @staticmethod
    def forward(ctx, q, k, v):
        T, d = q.shape[-2], q.shape[-1]
        scale = d ** -0.5
        with no_grad():
            q, k, v = q.detach(), k.detach(), v.detach()
            bias = Tensor(np.where(np.tril(np.ones((T, T))) > 0, 0.0, -np.inf), dtype=q.dtype)
            p = ((q * scale) @ k.transpose(-2, -1) + bias).softmax(-1)
            ctx.save_for_backward(q, k, v, p)
            ctx.scale = scale
            return (p @ v).data

    @staticmethod
    def backward(ctx, grad):
        q, k, v, p = ctx.saved_tensors
        dv = p.transpose(-2, -1) @ grad
        dp = grad @ v.transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))
        return (ds @ k) * ctx.scale, (ds.transpose(-2, -1) @ q) * ctx.scale, dv


class AttentionKeepsScores(Function):
    """Right numbers; keeps the scores, the masked scores and the weights: three (B, H, T, T) arrays."""

    @staticmethod
    def forward(ctx, q, k, v):
        T, d = q.shape[-2], q.shape[-1]
        with no_grad():
            q, k, v = q.detach(), k.detach(), v.detach()
            future = Tensor(np.triu(np.ones((T, T)), k=1), dtype=q.dtype)
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            masked = scores.masked_fill(future, float("-inf"))
            p = masked.softmax(-1)
            ctx.q, ctx.k, ctx.v, ctx.scores, ctx.masked, ctx.p = q, k, v, scores, masked, p
            return (p @ v).data

    @staticmethod
    def backward(ctx, grad):
        q, k, v, p = ctx.q, ctx.k, ctx.v, ctx.p
        dp = grad @ v.transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True)) * (1.0 / math.sqrt(q.shape[-1]))
        return ds @ k, ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ grad


class AttentionRecords(Function):
    """Right numbers; the forward's ops recorded."""

    @staticmethod
    def forward(ctx, q, k, v):
        T, d = q.shape[-2], q.shape[-1]
        future = Tensor(np.triu(np.ones((T, T)), k=1), dtype=q.dtype)
        p = ((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))).masked_fill(future, float("-inf")).softmax(-1)
        ctx.q, ctx.k, ctx.v, ctx.p = q.detach(), k.detach(), v.detach(), p.detach()
        return (p @ v).data

    @staticmethod
    def backward(ctx, grad):
        q, k, v, p = ctx.q, ctx.k, ctx.v, ctx.p
        dp = grad @ v.transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True)) * (1.0 / math.sqrt(q.shape[-1]))
        return ds @ k, ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ grad


class AttentionNoScaleBack(Function):
    """Wrong: the scale forgotten in the gradients of q and k."""

    @staticmethod
    def forward(ctx, q, k, v):
        T, d = q.shape[-2], q.shape[-1]
        with no_grad():
            q, k, v = q.detach(), k.detach(), v.detach()
            future = Tensor(np.triu(np.ones((T, T)), k=1), dtype=q.dtype)
            ctx.p = ((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))).masked_fill(future, float("-inf")).softmax(-1)
            ctx.q, ctx.k, ctx.v = q, k, v
            return (ctx.p @ v).data

    @staticmethod
    def backward(ctx, grad):
        q, k, v, p = ctx.q, ctx.k, ctx.v, ctx.p
        dp = grad @ v.transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))
        return ds @ k, ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ grad


# the names the Block and the GPT read
CausalAttention = AttentionAdditiveMask


# ---------------------------------------------------------------- 7. the block

class MLP(cnn.Module):
    def __init__(self, config, dtype):
        super().__init__()
        self.c_fc = cnn.Linear(config.n_embd, 4 * config.n_embd, dtype=dtype)
        self.c_proj = cnn.Linear(4 * config.n_embd, config.n_embd, dtype=dtype)

    def forward(self, x):
        return self.c_proj(self.c_fc(x).gelu("tanh"))


class CausalSelfAttention(cnn.Module):
    """Correct, another layout: one reshape to (B, T, 3, H, hd), one permute, then the three by index."""

    def __init__(self, config, dtype):
        super().__init__()
        if config.n_embd % config.n_head != 0:
            raise ValueError(f"n_head {config.n_head} does not divide n_embd {config.n_embd}")
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.c_attn = cnn.Linear(config.n_embd, 3 * config.n_embd, dtype=dtype)
        self.c_proj = cnn.Linear(config.n_embd, config.n_embd, dtype=dtype)

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        qkv = self.c_attn(x).reshape(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
        y = CausalAttention.apply(qkv[0], qkv[1], qkv[2])
        return self.c_proj(y.permute(0, 2, 1, 3).reshape(B, T, C))


class Block(cnn.Module):
    def __init__(self, config, dtype):
        super().__init__()
        self.ln_1 = cnn.LayerNorm(config.n_embd, dtype=dtype)
        self.attn = CausalSelfAttention(config, dtype)
        self.ln_2 = cnn.LayerNorm(config.n_embd, dtype=dtype)
        self.mlp = MLP(config, dtype)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class AttentionReshapeBack(cnn.Module):
    """Wrong: the heads put back with a reshape alone."""

    def __init__(self, config, dtype):
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError("n_head must divide n_embd")
        self.n_head = config.n_head
        self.c_attn = cnn.Linear(config.n_embd, 3 * config.n_embd, dtype=dtype)
        self.c_proj = cnn.Linear(config.n_embd, config.n_embd, dtype=dtype)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.reshape(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        return self.c_proj(CausalAttention.apply(q, k, v).reshape(B, T, C))


class BlockReshapeBack(cnn.Module):
    def __init__(self, config, dtype):
        super().__init__()
        self.ln_1 = cnn.LayerNorm(config.n_embd, dtype=dtype)
        self.attn = AttentionReshapeBack(config, dtype)
        self.ln_2 = cnn.LayerNorm(config.n_embd, dtype=dtype)
        self.mlp = MLP(config, dtype)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class BlockPostNorm(cnn.Module):
    """Wrong: post-norm."""

    def __init__(self, config, dtype):
        super().__init__()
        self.ln_1 = cnn.LayerNorm(config.n_embd, dtype=dtype)
        self.attn = CausalSelfAttention(config, dtype)
        self.ln_2 = cnn.LayerNorm(config.n_embd, dtype=dtype)
        self.mlp = MLP(config, dtype)

    def forward(self, x):
        x = self.ln_1(x + self.attn(x))
        return self.ln_2(x + self.mlp(x))


class AttentionNoGuard(cnn.Module):
    """Wrong: no error when n_head does not divide n_embd."""

    def __init__(self, config, dtype):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = cnn.Linear(config.n_embd, 3 * config.n_embd, dtype=dtype)
        self.c_proj = cnn.Linear(config.n_embd, config.n_embd, dtype=dtype)

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        qkv = self.c_attn(x).reshape(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
        y = CausalAttention.apply(qkv[0], qkv[1], qkv[2])
        return self.c_proj(y.permute(0, 2, 1, 3).reshape(B, T, C))


class BlockNoGuard(cnn.Module):
    def __init__(self, config, dtype):
        super().__init__()
        self.ln_1 = cnn.LayerNorm(config.n_embd, dtype=dtype)
        self.attn = AttentionNoGuard(config, dtype)
        self.ln_2 = cnn.LayerNorm(config.n_embd, dtype=dtype)
        self.mlp = MLP(config, dtype)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


# ---------------------------------------------------------------- 8. the GPT

class GPTReverseDraws(cnn.Module):
    """Correct: tied the other way round (the embedding takes the head's Parameter), matrices drawn module by
    module, last module first."""

    def __init__(self, config, dtype=np.float32):
        super().__init__()
        self.config = config
        C = config.n_embd
        self.transformer = cnn.ModuleDict(dict(
            wte=cnn.Embedding(config.vocab_size, C, dtype=dtype),
            wpe=cnn.Embedding(config.block_size, C, dtype=dtype),
            h=[Block(config, dtype) for _ in range(config.n_layer)],
            ln_f=cnn.LayerNorm(C, dtype=dtype),
        ))
        self.lm_head = cnn.Linear(C, config.vocab_size, bias=False, dtype=dtype)
        self.transformer.wte.weight = self.lm_head.weight
        g = ct.generator()
        small = 0.02 / math.sqrt(2 * config.n_layer)
        for name, p in reversed(list(self.named_parameters())):
            if len(p.shape) >= 2:
                std = small if name.endswith("c_proj.weight") else 0.02
                p.copy_(Tensor(g.normal(0.0, std, size=p.shape), dtype=p.dtype))
            elif "ln" in name and name.endswith("weight"):
                p.copy_(Tensor(np.ones(p.shape), dtype=p.dtype))
            else:
                p.copy_(Tensor(np.zeros(p.shape), dtype=p.dtype))

    def forward(self, idx, targets=None):
        idx = np.asarray(idx)
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = np.arange(T)[None, :]
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for blk in self.transformer.h:
            x = blk(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = ct.cross_entropy(logits.reshape(B * T, self.config.vocab_size), np.asarray(targets).reshape(B * T))
        return logits, loss


def make_gpt(untie=False, scale_proj=True, guard=True, zero_bias=True):
    class GPTVariant(cnn.Module):
        def __init__(self, config, dtype=np.float32):
            super().__init__()
            self.config = config
            self.transformer = cnn.ModuleDict(dict(
                wte=cnn.Embedding(config.vocab_size, config.n_embd, dtype=dtype),
                wpe=cnn.Embedding(config.block_size, config.n_embd, dtype=dtype),
                h=[Block(config, dtype) for _ in range(config.n_layer)],
                ln_f=cnn.LayerNorm(config.n_embd, dtype=dtype),
            ))
            self.lm_head = cnn.Linear(config.n_embd, config.vocab_size, bias=False, dtype=dtype)
            if not untie:
                self.lm_head.weight = self.transformer.wte.weight
            residual_std = 0.02 / math.sqrt(2 * config.n_layer) if scale_proj else 0.02
            for name, p in self.named_parameters():
                if p.ndim == 2:
                    std = residual_std if name.endswith("c_proj.weight") else 0.02
                    p.copy_(Tensor(ct.generator().normal(0.0, std, p.shape), dtype=p.dtype))
                elif name.endswith(".bias") and zero_bias:
                    p.copy_(Tensor(np.zeros(p.shape), dtype=p.dtype))
            if untie:
                self.lm_head.weight.copy_(Tensor(self.transformer.wte.weight.numpy().copy(), dtype=dtype))

        def forward(self, idx, targets=None):
            idx = np.asarray(idx, dtype=np.int64)
            B, T = idx.shape
            if guard and T > self.config.block_size:
                raise ValueError("too long")
            x = self.transformer.wte(idx) + self.transformer.wpe(np.arange(T) % self.config.block_size)
            for block in self.transformer.h:
                x = block(x)
            logits = self.lm_head(self.transformer.ln_f(x))
            if targets is None:
                return logits, None
            return logits, ct.cross_entropy(logits.reshape(B * T, -1), np.asarray(targets, dtype=np.int64).reshape(-1))
    return GPTVariant


# ---------------------------------------------------------------- 9. AdamW

def param_groups_by_len(model, weight_decay):
    decay, plain = [], []
    for p in model.parameters():
        (decay if len(p.shape) >= 2 else plain).append(p)
    return [{"params": plain, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]


class AdamWKeyed:
    """Correct, written differently: state keyed by (group, index), the defaults in a dict, lists in state_dict."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, adam_step):
        params = list(params)
        if params and isinstance(params[0], dict):
            groups = params
        else:
            groups = [{"params": params}]
        self.defaults = {"lr": lr, "weight_decay": weight_decay}
        self.param_groups = []
        for g in groups:
            group = dict(self.defaults)
            group.update({key: val for key, val in g.items() if key != "params"})
            group["params"] = list(g["params"])
            self.param_groups.append(group)
        self.b1, self.b2 = betas
        self.eps = eps
        self.adam_step = adam_step
        self.state = {}

    def zero_grad(self, set_to_none=True):
        for g in self.param_groups:
            for p in g["params"]:
                p.grad = None

    def step(self):
        for gi, g in enumerate(self.param_groups):
            for pi, p in enumerate(g["params"]):
                if p.grad is None:
                    continue
                key = (gi, pi)
                if key not in self.state:
                    self.state[key] = [0, np.zeros_like(p.numpy()), np.zeros_like(p.numpy())]
                st = self.state[key]
                st[0] += 1
                decayed = p.numpy() - g["lr"] * g["weight_decay"] * p.numpy()
                new_p, st[1], st[2] = self.adam_step(decayed, p.grad.numpy(), st[1], st[2], st[0], g["lr"],
                                                     self.b1, self.b2, self.eps)
                p.copy_(Tensor(new_p, dtype=p.dtype))

    def state_dict(self):
        return {"per_param": [[key[0], key[1], st[0], st[1].copy(), st[2].copy()] for key, st in self.state.items()],
                "lr": [g["lr"] for g in self.param_groups],
                "wd": [g["weight_decay"] for g in self.param_groups]}

    def load_state_dict(self, state):
        self.state = {(gi, pi): [t, np.array(m), np.array(v)] for gi, pi, t, m, v in state["per_param"]}
        for g, lr, wd in zip(self.param_groups, state["lr"], state["wd"]):
            g["lr"], g["weight_decay"] = lr, wd


def make_adamw(l2=False, global_step=False, drop_steps=False):
    class AdamWVariant:
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, adam_step):
            groups = list(params)
            if groups and not isinstance(groups[0], dict):
                groups = [{"params": groups}]
            self.param_groups = [{"lr": lr, "weight_decay": weight_decay, **group, "params": list(group["params"])}
                                 for group in groups]
            self.betas, self.eps, self.adam_step = tuple(betas), eps, adam_step
            self.state = {}
            self.t = 0

        def zero_grad(self, set_to_none=True):
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = None

        def step(self):
            b1, b2 = self.betas
            self.t += 1
            place = 0
            for group in self.param_groups:
                lr, decay = group["lr"], group["weight_decay"]
                for p in group["params"]:
                    if p.grad is not None:
                        if place not in self.state:
                            self.state[place] = {"step": 0, "m": np.zeros(p.shape, p.dtype), "v": np.zeros(p.shape, p.dtype)}
                        s = self.state[place]
                        s["step"] += 1
                        t = self.t if global_step else s["step"]
                        if l2:
                            new, s["m"], s["v"] = self.adam_step(p.numpy(), p.grad.numpy() + decay * p.numpy(), s["m"],
                                                                 s["v"], t, lr, b1, b2, self.eps)
                        else:
                            new, s["m"], s["v"] = self.adam_step(p.numpy() * (1 - lr * decay), p.grad.numpy(), s["m"],
                                                                 s["v"], t, lr, b1, b2, self.eps)
                        p.copy_(Tensor(new, dtype=p.dtype))
                    place += 1

        def state_dict(self):
            return {"state": {place: {"step": 0 if drop_steps else s["step"], "m": s["m"].copy(), "v": s["v"].copy()}
                              for place, s in self.state.items()},
                    "t": 0 if drop_steps else self.t,
                    "groups": [{"lr": g["lr"], "weight_decay": g["weight_decay"]} for g in self.param_groups]}

        def load_state_dict(self, state):
            self.state = {place: {"step": s["step"], "m": np.array(s["m"]), "v": np.array(s["v"])}
                          for place, s in state["state"].items()}
            self.t = state["t"]
            for group, options in zip(self.param_groups, state["groups"]):
                group.update(options)
    return AdamWVariant


def param_groups_ok(model, weight_decay):
    params = model.parameters()
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


# ---------------------------------------------------------------- 10. schedule

def lr_at(it, cfg):
    """Correct, with cos^2: 0.5 (1 + cos(pi x)) = cos^2(pi x / 2)."""
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    if it < cfg.warmup_iters:
        return (it + 1) * cfg.lr / cfg.warmup_iters
    x = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * math.cos(math.pi * x / 2) ** 2


def lr_from_zero(it, cfg):                 # wrong: step 0 trains with rate 0
    if it < cfg.warmup_iters:
        return cfg.lr * it / cfg.warmup_iters
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    x = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * x)) * (cfg.lr - cfg.min_lr)


def lr_cosine_from_zero(it, cfg):          # wrong: the cosine's clock starts at step 0
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / cfg.warmup_iters
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    x = it / cfg.lr_decay_iters
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * x)) * (cfg.lr - cfg.min_lr)


def lr_off_by_one(it, cfg):                # wrong: the cosine's phase one step late
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / cfg.warmup_iters
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    x = (it - cfg.warmup_iters + 1) / (cfg.lr_decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * x)) * (cfg.lr - cfg.min_lr)


# ---------------------------------------------------------------- 11. clipping

def clip_via_numpy(params, max_norm):
    """Correct: every gradient flattened into one numpy vector for the norm."""
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        return 0.0
    norm = float(np.linalg.norm(np.concatenate([p.grad.numpy().ravel() for p in with_grad])))
    if norm > max_norm:
        f = max_norm / (norm + 1e-6)
        for p in with_grad:
            p.grad = p.grad * f
    return norm


def clip_per_tensor(params, max_norm):     # wrong property: each tensor clipped by its own norm
    total = 0.0
    for p in params:
        if p.grad is None:
            continue
        n = float((p.grad * p.grad).sum()) ** 0.5
        total += n * n
        if n > max_norm:
            p.grad = p.grad * (max_norm / (n + 1e-6))
    return total ** 0.5


def clip_always(params, max_norm):         # wrong: scales even below the bound
    grads = [p for p in params if p.grad is not None]
    total = math.sqrt(sum(float((p.grad * p.grad).sum()) for p in grads))
    for p in grads:
        p.grad = p.grad * (max_norm / (total + 1e-6))
    return total


def clip_returns_after(params, max_norm):  # wrong: returns the norm after clipping
    grads = [p for p in params if p.grad is not None]
    total = math.sqrt(sum(float((p.grad * p.grad).sum()) for p in grads))
    if total > max_norm:
        for p in grads:
            p.grad = p.grad * (max_norm / (total + 1e-6))
        total = math.sqrt(sum(float((p.grad * p.grad).sum()) for p in grads))
    return total


def clip_no_epsilon(params, max_norm):     # plausible: max_norm / norm, not torch's max_norm / (norm + 1e-6)
    grads = [p for p in params if p.grad is not None]
    total = math.sqrt(sum(float((p.grad * p.grad).sum()) for p in grads))
    if total > max_norm:
        for p in grads:
            p.grad = p.grad * (max_norm / total)
    return total


# ---------------------------------------------------------------- 12. checkpoints

def save_checkpoint(path, it, model, optimizer, batches):
    """Correct, another way: a tuple, and the whole Generator object pickled."""
    with open(path, "wb") as f:
        pickle.dump((it, model.state_dict(), optimizer.state_dict(), copy.deepcopy(batches.rng)), f)


def load_checkpoint(path, model, optimizer, batches):
    with open(path, "rb") as f:
        it, weights, opt_state, rng = pickle.load(f)
    model.load_state_dict(weights)
    optimizer.load_state_dict(opt_state)
    batches.rng = rng
    return it


def save_no_rng(path, it, model, optimizer, batches):        # wrong: the draws' state is lost
    with open(path, "wb") as f:
        pickle.dump({"it": it, "model": model.state_dict(), "opt": optimizer.state_dict()}, f)


def load_no_rng(path, model, optimizer, batches):
    with open(path, "rb") as f:
        s = pickle.load(f)
    model.load_state_dict(s["model"])
    optimizer.load_state_dict(s["opt"])
    return s["it"]


def save_no_optimizer(path, it, model, optimizer, batches):  # wrong: the optimizer's state is lost
    with open(path, "wb") as f:
        pickle.dump({"it": it, "model": model.state_dict(), "rng": batches.rng.bit_generator.state}, f)


def load_no_optimizer(path, model, optimizer, batches):
    with open(path, "rb") as f:
        s = pickle.load(f)
    model.load_state_dict(s["model"])
    batches.rng.bit_generator.state = s["rng"]
    return s["it"]


# ---------------------------------------------------------------- 13. the loop

def train_while(model, optimizer, batches, cfg, lib, checkpoint=None, save_every=0, resume=False):
    """Correct, a while loop and an evaluation helper that returns its two means."""
    hist = dict(iter=[], lr=[], loss=[], eval_iter=[], train_loss=[], val_loss=[])

    def mean_loss(split):
        total = 0.0
        for _ in range(cfg.eval_iters):
            x, y = batches.get(split)
            total += float(model(x, y)[1])
        return total / cfg.eval_iters

    def evaluate(at):
        model.eval()
        with lib.no_grad():
            tr = mean_loss("train")
            va = mean_loss("val")
        model.train()
        hist["eval_iter"].append(at)
        hist["train_loss"].append(tr)
        hist["val_loss"].append(va)

    step = 0
    if resume:
        step = load_checkpoint(checkpoint, model, optimizer, batches)
    model.train()
    while step < cfg.max_iters:
        if cfg.eval_interval and step % cfg.eval_interval == 0:
            evaluate(step)
        rate = lr_at(step, cfg)
        for g in optimizer.param_groups:
            g["lr"] = rate
        x, y = batches.get("train")
        loss = train_step(model, optimizer, x, y, cfg.grad_clip, lib)
        hist["iter"].append(step)
        hist["lr"].append(rate)
        hist["loss"].append(float(loss))
        step += 1
        if checkpoint and save_every and step % save_every == 0:
            save_checkpoint(checkpoint, step, model, optimizer, batches)
    evaluate(cfg.max_iters)
    return hist


def make_train(forget_resume_step=False, no_final_eval=False):
    def train(model, optimizer, batches, cfg, lib, checkpoint=None, save_every=0, resume=False):
        history = {key: [] for key in ("iter", "lr", "loss", "eval_iter", "train_loss", "val_loss")}

        def evaluate(it):
            model.eval()
            with lib.no_grad():
                for split in ("train", "val"):
                    losses = [float(model(*batches.get(split))[1]) for _ in range(cfg.eval_iters)]
                    history[f"{split}_loss"].append(sum(losses) / len(losses))
            model.train()
            history["eval_iter"].append(it)

        first = load_checkpoint(checkpoint, model, optimizer, batches) if resume else 0
        if forget_resume_step:
            first = 0
        model.train()
        for it in range(first, cfg.max_iters):
            if cfg.eval_interval and it % cfg.eval_interval == 0:
                evaluate(it)
            lr = lr_at(it, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, y = batches.get("train")
            loss = float(train_step(model, optimizer, x, y, cfg.grad_clip, lib))
            for key, value in (("iter", it), ("lr", lr), ("loss", loss)):
                history[key].append(value)
            if checkpoint is not None and save_every and (it + 1) % save_every == 0:
                save_checkpoint(checkpoint, it + 1, model, optimizer, batches)
        if not no_final_eval:
            evaluate(cfg.max_iters)
        return history
    return train


# ---------------------------------------------------------------- 14. sampling

def generate_partition(model, idx, max_new_tokens, temperature, top_k, draw):
    """Correct: np.partition for the k-th largest, the window cut by a start index."""
    model.eval()
    ids = np.array(idx, dtype=np.int64)
    bs = model.config.block_size
    for _ in range(max_new_tokens):
        window = ids[:, max(0, ids.shape[1] - bs):]
        with no_grad():
            logits = model(window)[0]
        z = logits.numpy()[:, -1, :] / temperature
        if top_k is not None and top_k < z.shape[1]:
            kth = np.partition(z, z.shape[1] - top_k, axis=1)[:, z.shape[1] - top_k][:, None]
            z = np.where(z >= kth, z, -np.inf)
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p = p / p.sum(axis=1, keepdims=True)
        nxt = np.asarray(draw(p), dtype=np.int64).reshape(-1, 1)
        ids = np.concatenate([ids, nxt], axis=1)
    return ids


def generate_power(model, idx, max_new_tokens, temperature, top_k, draw):
    """Correct: softmax first, then the temperature as a power (p^(1/T), renormalised: the same distribution)."""
    model.eval()
    ids = np.array(idx, dtype=np.int64)
    for _ in range(max_new_tokens):
        with no_grad():
            logits = model(ids[:, -model.config.block_size:])[0].numpy()[:, -1, :]
        if top_k is not None and top_k < logits.shape[1]:
            kth = np.sort(logits, axis=1)[:, -top_k][:, None]
            logits = np.where(logits < kth, -np.inf, logits)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p = p ** (1.0 / temperature)
        p /= p.sum(axis=1, keepdims=True)
        ids = np.concatenate([ids, np.asarray(draw(p), dtype=np.int64)[:, None]], axis=1)
    return ids


def make_generate(crop=True, grad_off=True, eval_mode=True):
    def generate(model, idx, max_new_tokens, temperature, top_k, draw):
        if eval_mode:
            model.eval()
        idx = np.asarray(idx, dtype=np.int64)
        for _ in range(max_new_tokens):
            window = idx[:, -model.config.block_size:] if crop else idx
            if grad_off:
                with no_grad():
                    logits, _ = model(window)
            else:
                logits, _ = model(window)
            last = logits.numpy()[:, -1, :] / temperature
            if top_k is not None and top_k < last.shape[-1]:
                kth = np.sort(last, axis=-1)[:, -top_k, None]
                last = np.where(last < kth, -np.inf, last)
            probs = np.exp(last - last.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            idx = np.concatenate([idx, np.asarray(draw(probs), dtype=np.int64).reshape(-1, 1)], axis=1)
        return idx
    return generate

# ---------------------------------------------------------------- more answers of the same exercises

class AttentionComposed(nn.Module):
    """Right numbers; attends with the library's recorded ops instead of the one fused op."""

    def __init__(self, config, dtype):
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError("n_head must divide n_embd")
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, dtype=dtype)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, dtype=dtype)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = (t.reshape(B, T, self.n_head, hd).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        future = Tensor(np.triu(np.ones((T, T)), k=1), dtype=x.dtype)
        p = ((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))).masked_fill(future, float("-inf")).softmax(-1)
        return self.c_proj((p @ v).transpose(1, 2).reshape(B, T, C))


class BlockComposed(nn.Module):
    def __init__(self, config, dtype):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.attn = AttentionComposed(config, dtype)
        self.ln_2 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.mlp = MLP(config, dtype)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


# ---------------------------------------------------------------- chapter 12's cases

ACCEPT_12 = [
    case("softmax_saved", ch12.softmax_function, SoftmaxSaved),
    case("gelu_keeps_tanh", ch12.gelu_function, GELUKeepsTanh),
    case("gelu_recomputes", ch12.gelu_function, GELURecomputes),
    case("layer_norm_centered", ch12.layer_norm_function, LayerNormCentered),
    case("embedding_bincount", ch12.embedding_function, EmbeddingBincount),
    case("masked_fill_eq", ch12.masked_fill_function, MaskedFillEq),
    case("attention_additive_mask", ch12.attention_function, AttentionAdditiveMask),
    case("block_one_permute", ch12.block, Block),
    case("gpt_reverse_draws", ch12.gpt, GPTReverseDraws),
    case("adamw_keyed", ch12.adamw, param_groups_by_len, AdamWKeyed),
    case("lr_cos_squared", ch12.lr_schedule, lr_at),
    case("clip_via_numpy", ch12.clip_grad_norm, clip_via_numpy),
    case("checkpoint_tuple_and_generator", ch12.checkpoint, save_checkpoint, load_checkpoint),
    case("train_while", ch12.train, train_while),
    case("generate_partition", ch12.generate, generate_partition),
    case("generate_power", ch12.generate, generate_power),
]

REJECT_12 = [
    case("block_composed_attention", ch12.block, BlockComposed),
    case("softmax_records", ch12.softmax_function, SoftmaxRecords),
    case("softmax_keeps_exp", ch12.softmax_function, SoftmaxKeepsExp),
    case("softmax_logsoftmax_rule", ch12.softmax_function, SoftmaxLogSoftmaxRule),
    case("softmax_no_shift", ch12.softmax_function, SoftmaxNoShift),
    case("gelu_keeps_everything", ch12.gelu_function, GELUKeepsEverything),
    case("gelu_records", ch12.gelu_function, GELURecords),
    case("gelu_half_once", ch12.gelu_function, GELUHalfOnce),
    case("layer_norm_keeps_three", ch12.layer_norm_function, LayerNormKeepsThree),
    case("layer_norm_fixed_eps", ch12.layer_norm_function, LayerNormFixedEps),
    case("layer_norm_no_mean_path", ch12.layer_norm_function, LayerNormNoMeanPath),
    case("embedding_fancy_add", ch12.embedding_function, EmbeddingFancyAdd),
    case("embedding_keeps_table", ch12.embedding_function, EmbeddingKeepsTable),
    case("masked_fill_arithmetic", ch12.masked_fill_function, MaskedFillArithmetic),
    case("masked_fill_grad_everywhere", ch12.masked_fill_function, MaskedFillGradEverywhere),
    case("masked_fill_records", ch12.masked_fill_function, MaskedFillRecords),
    case("attention_keeps_scores", ch12.attention_function, AttentionKeepsScores),
    case("attention_records", ch12.attention_function, AttentionRecords),
    case("attention_no_scale_back", ch12.attention_function, AttentionNoScaleBack),
    case("block_reshape_back", ch12.block, BlockReshapeBack),
    case("block_post_norm", ch12.block, BlockPostNorm),
    case("block_no_guard", ch12.block, BlockNoGuard),
    case("gpt_untied", ch12.gpt, make_gpt(untie=True)),
    case("gpt_proj_unscaled", ch12.gpt, make_gpt(scale_proj=False)),
    case("gpt_no_length_guard", ch12.gpt, make_gpt(guard=False)),
    case("gpt_bias_not_zeroed", ch12.gpt, make_gpt(zero_bias=False)),
    case("adamw_l2", ch12.adamw, param_groups_ok, make_adamw(l2=True)),
    case("adamw_global_step", ch12.adamw, param_groups_ok, make_adamw(global_step=True)),
    case("adamw_state_loses_steps", ch12.adamw, param_groups_ok, make_adamw(drop_steps=True)),
    case("lr_from_zero", ch12.lr_schedule, lr_from_zero),
    case("lr_cosine_from_zero", ch12.lr_schedule, lr_cosine_from_zero),
    case("lr_off_by_one", ch12.lr_schedule, lr_off_by_one),
    case("clip_per_tensor", ch12.clip_grad_norm, clip_per_tensor),
    case("clip_always", ch12.clip_grad_norm, clip_always),
    case("clip_returns_after", ch12.clip_grad_norm, clip_returns_after),
    case("clip_no_epsilon", ch12.clip_grad_norm, clip_no_epsilon),
    case("checkpoint_no_rng", ch12.checkpoint, save_no_rng, load_no_rng),
    case("checkpoint_no_optimizer", ch12.checkpoint, save_no_optimizer, load_no_optimizer),
    case("train_forgets_resume_step", ch12.train, make_train(forget_resume_step=True)),
    case("train_no_final_eval", ch12.train, make_train(no_final_eval=True)),
    case("generate_no_crop", ch12.generate, make_generate(crop=False)),
    case("generate_records", ch12.generate, make_generate(grad_off=False)),
    case("generate_train_mode", ch12.generate, make_generate(eval_mode=False)),
]


# ==================================================================================================
# Chapter 13: the compiler
# ==================================================================================================

# ---------------------------------------------------------------- 1. record

def record_lookup_first(tracer, kind, op, inputs, out, into, attrs):
    """Correct, written differently: a helper per operand, the scratch write first, attrs copied up front."""
    attrs = dict(attrs)

    def operand(td):
        known = tracer.by_storage.get(id(td.storage))
        if known is None:
            known = tracer.buffer(CONST, td.storage)
            known.value = td.storage.copy()
        return Ref(known, View(tuple(td.shape), tuple(td.strides), int(td.offset)))

    operands = [operand(td) for td in inputs]
    if into:
        target = tracer.by_storage[id(out.storage)]
        attrs["into"] = True
        attrs["after"] = target.producer
    else:
        target = tracer.buffer(TEMP, out.storage)
    node = Node(id=len(tracer.nodes), kind=kind, op=op, inputs=operands,
                out=Ref(target, View(tuple(out.shape), tuple(out.strides), int(out.offset))), attrs=attrs)
    target.producer = node
    tracer.nodes.append(node)
    return node


def make_record(copy_const=True, by_view=False, after=True, keep_attrs=True, into_new=False):
    def record(tracer, kind, op, inputs, out, into, attrs):
        refs = []
        for td in inputs:
            key = id(td) if by_view else id(td.storage)
            buf = tracer.by_storage.get(key)
            if buf is None:
                buf = tracer.buffer(CONST, td.storage)
                if by_view:
                    tracer.by_storage[id(td)] = buf
                buf.value = np.array(td.storage) if copy_const else td.storage
            refs.append(Ref(buf, View.of(td)))
        new_attrs = dict(attrs) if keep_attrs else {}
        if into and not into_new:
            buf = tracer.by_storage[id(out.storage)]
            new_attrs["into"] = True
            if after:
                new_attrs["after"] = buf.producer
        else:
            buf = tracer.buffer(TEMP, out.storage)
        node = Node(len(tracer.nodes), kind, op, refs, Ref(buf, View.of(out)), new_attrs)
        buf.producer = node
        tracer.nodes.append(node)
        return node
    return record


# ---------------------------------------------------------------- 2. can_join

def can_join_careful(group, node):
    """The lesson's careful rule, on nodes: an elementwise op joins when it has the group's rows, reads the
    group's values at its own element, and reads nothing made later. No reductions."""
    if not group.fusable or group.reduces or not fusable(node) or node.kind == "reduce":
        return False
    if rows_of(node.shape) != group.rows:
        return False
    for ref in node.inputs:
        maker = ref.buffer.producer
        if maker is None:
            continue
        if maker in group:
            if read_kind(ref, tuple(node.shape)) != FULL or ref.view.offset != 0:
                return False
        elif maker.start > group.first:
            return False
    return True


def can_join_rows(group, node):
    """Correct, written my way: elementwise ops and last-dim reductions; per-row values after a reduction;
    in-group values read at the loop's own element (a per-row value: one per row)."""
    if not (group.fusable and fusable(node)):
        return False
    R, n = group.rows
    if node.kind == "reduce":
        shape = tuple(node.inputs[0].shape)
        if not shape or node.attrs["dim"] % len(shape) != len(shape) - 1 or rows_of(shape) != (R, n):
            return False
        consumer_per_row, loop = False, shape
    elif rows_of(node.shape) == (R, n):
        consumer_per_row, loop = False, tuple(node.shape)
    elif group.reduces and rows_of(node.shape) == (R, 1):
        consumer_per_row, loop = True, tuple(node.shape)
    else:
        return False
    for ref in node.inputs:
        maker = ref.buffer.producer
        if maker is None:
            continue
        if maker not in group:
            if maker.start > group.first:
                return False
            continue
        if ref.view.offset != 0:
            return False
        made_per_row = rows_of(maker.shape) != (R, n)
        if made_per_row and not consumer_per_row:
            if read_kind(ref, loop) != COL:
                return False
        elif not made_per_row and consumer_per_row:
            return False
        elif read_kind(ref, loop) != FULL:
            return False
    return True


def can_join_any_view(group, node):
    """Wrong: reads of in-group values through any view (a + a.T) allowed."""
    if not (group.fusable and fusable(node)) or node.kind == "reduce":
        return False
    if rows_of(node.shape) != group.rows:
        return False
    for ref in node.inputs:
        maker = ref.buffer.producer
        if maker is not None and maker not in group and maker.start > group.first:
            return False
    return True


def can_join_no_order(group, node):
    """Wrong: ignores whether an outside value exists yet."""
    if not (group.fusable and fusable(node)) or node.kind == "reduce":
        return False
    if rows_of(node.shape) != group.rows:
        return False
    for ref in node.inputs:
        maker = ref.buffer.producer
        if maker in group and (read_kind(ref, tuple(node.shape)) != FULL or ref.view.offset != 0):
            return False
    return True


def can_join_any_dim(group, node):
    """Wrong: a reduction over any dim joins."""
    if not (group.fusable and fusable(node)):
        return False
    shape = tuple(node.inputs[0].shape) if node.kind == "reduce" else tuple(node.shape)
    if rows_of(shape) != group.rows and not (group.reduces and rows_of(node.shape)[0] == group.rows[0]):
        return False
    for ref in node.inputs:
        maker = ref.buffer.producer
        if maker is None:
            continue
        if maker in group:
            if read_kind(ref, shape) not in (FULL, COL) or ref.view.offset != 0:
                return False
        elif maker.start > group.first:
            return False
    return True


def can_join_never(group, node):
    """Right (nothing illegal), but fuses nothing."""
    return False


# ---------------------------------------------------------------- 3. pointwise source

def pointwise_flat_index(kernel):
    """Correct: rows under prange, no slices for the outputs (written at r * n + j), ROW loads as they are."""
    nout, nin = len(kernel.stores), len(kernel.loads)
    head = ", ".join([f"out{k}" for k in range(nout)] + [f"in{j}" for j in range(nin)] + ["R", "n"])
    src = [f"def kernel({head}):", "    for r in prange(R):", "        base = r * n"]
    for j, load in enumerate(kernel.loads):
        if load.kind == FULL:
            src.append(f"        a{j} = in{j}[base:base + n]")
        elif load.kind == ROW:
            src.append(f"        a{j} = in{j}")
        elif load.kind == COL:
            src.append(f"        a{j} = in{j}[r]")
        else:
            src.append(f"        a{j} = in{j}[0]")
    src.append("        for j in range(n):")
    src += [f"            {s.name} = {expression(s, kernel)}" for s in kernel.steps]
    src += [f"            out{k}[base + j] = {name}" for k, name in enumerate(kernel.stores)]
    return "\n".join(src)


def pointwise_one_loop(kernel):
    """Correct: one prange over every element, its row and column by division."""
    nout, nin = len(kernel.stores), len(kernel.loads)
    head = ", ".join([f"out{k}" for k in range(nout)] + [f"in{j}" for j in range(nin)] + ["R", "n"])
    src = [f"def kernel({head}):", "    for i in prange(R * n):", "        r = i // n", "        j0 = i - r * n"]
    for j, load in enumerate(kernel.loads):
        if load.kind == FULL:
            src.append(f"        a{j} = in{j}[r * n:r * n + n]")
        elif load.kind == ROW:
            src.append(f"        a{j} = in{j}")
        elif load.kind == COL:
            src.append(f"        a{j} = in{j}[r]")
        else:
            src.append(f"        a{j} = in{j}[0]")
    src.append("        for j in range(j0, j0 + 1):")
    src += [f"            {s.name} = {expression(s, kernel)}" for s in kernel.steps]
    src += [f"            out{k}[i] = {name}" for k, name in enumerate(kernel.stores)]
    return "\n".join(src)


def pointwise_row_blocks(kernel):
    """Correct: prange over blocks of 4 rows, each row alone inside."""
    nout, nin = len(kernel.stores), len(kernel.loads)
    head = ", ".join([f"out{k}" for k in range(nout)] + [f"in{j}" for j in range(nin)] + ["R", "n"])
    src = [f"def kernel({head}):", "    for blk in prange((R + 3) // 4):",
           "        for r in range(4 * blk, min(R, 4 * blk + 4)):"]
    for j, load in enumerate(kernel.loads):
        index = {FULL: "r * n:(r + 1) * n", ROW: ":n", COL: "r", ONE: "0"}[load.kind]
        src.append(f"            a{j} = in{j}[{index}]")
    src.append("            for j in range(n):")
    src += [f"                {s.name} = {expression(s, kernel)}" for s in kernel.steps]
    src += [f"                out{k}[r * n + j] = {name}" for k, name in enumerate(kernel.stores)]
    return "\n".join(src)


def pointwise_columns_parallel(kernel):
    """Right numbers; rows serial, prange over the columns."""
    nout, nin = len(kernel.stores), len(kernel.loads)
    head = ", ".join([f"out{k}" for k in range(nout)] + [f"in{j}" for j in range(nin)] + ["R", "n"])
    src = [f"def kernel({head}):", "    for r in range(R):"]
    for j, load in enumerate(kernel.loads):
        index = {FULL: "r * n:(r + 1) * n", ROW: ":n", COL: "r", ONE: "0"}[load.kind]
        src.append(f"        a{j} = in{j}[{index}]")
    src.append("        for j in prange(n):")
    src += [f"            {s.name} = {expression(s, kernel)}" for s in kernel.steps]
    src += [f"            out{k}[r * n + j] = {name}" for k, name in enumerate(kernel.stores)]
    return "\n".join(src)


def pointwise_prange_of_one(kernel):
    """Right numbers; the text has prange, but a prange of one iteration around a serial loop."""
    nout, nin = len(kernel.stores), len(kernel.loads)
    head = ", ".join([f"out{k}" for k in range(nout)] + [f"in{j}" for j in range(nin)] + ["R", "n"])
    src = [f"def kernel({head}):", "    for _ in prange(1):", "        for r in range(R):"]
    for j, load in enumerate(kernel.loads):
        index = {FULL: "r * n:(r + 1) * n", ROW: ":n", COL: "r", ONE: "0"}[load.kind]
        src.append(f"            a{j} = in{j}[{index}]")
    src.append("            for j in range(n):")
    src += [f"                {s.name} = {expression(s, kernel)}" for s in kernel.steps]
    src += [f"                out{k}[r * n + j] = {name}" for k, name in enumerate(kernel.stores)]
    return "\n".join(src)


def pointwise_col_by_j(kernel):
    """Wrong: a COL load read at the column, not the row."""
    nout, nin = len(kernel.stores), len(kernel.loads)
    head = ", ".join([f"out{k}" for k in range(nout)] + [f"in{j}" for j in range(nin)] + ["R", "n"])
    src = [f"def kernel({head}):", "    for r in prange(R):"]
    for j, load in enumerate(kernel.loads):
        index = {FULL: "r * n:(r + 1) * n", ROW: ":n", COL: "r", ONE: "0"}[load.kind]
        src.append(f"        a{j} = in{j}[{index}]" if load.kind != COL else f"        c{j} = in{j}")
    src.append("        for j in range(n):")
    for j, load in enumerate(kernel.loads):
        if load.kind == COL:
            src.append(f"            a{j} = c{j}[j % c{j}.shape[0]]")
    src += [f"            {s.name} = {expression(s, kernel)}" for s in kernel.steps]
    src += [f"            out{k}[r * n + j] = {name}" for k, name in enumerate(kernel.stores)]
    return "\n".join(src)


# ---------------------------------------------------------------- 4. guard

def guard_my_words(expected, args):
    """Correct: its own wording and order (kind, then dtype, then shape)."""
    if len(args) != len(expected):
        return f"{len(args)} arguments now, {len(expected)} at capture"
    for i, (entry, value) in enumerate(zip(expected, args)):
        what = entry[0]
        if what == "tensor" or what == "array":
            is_tensor = isinstance(value, T.Tensor)
            ok_kind = is_tensor if what == "tensor" else (is_array(value) and not is_tensor)
            if not ok_kind:
                return f"arg #{i}: a {what} at capture, now a {type(value).__name__}"
            dt = np.dtype(value.dtype).name if is_tensor else np.asarray(value).dtype.name
            if dt != entry[2]:
                return f"arg #{i}: dtype {dt} now, {entry[2]} at capture"
            if tuple(value.shape) != tuple(entry[1]):
                return f"arg #{i}: shape {tuple(value.shape)} now, {tuple(entry[1])} at capture"
        elif what == "object":
            if value is not entry[1]:
                return f"arg #{i}: not the {type(entry[1]).__name__} object seen at capture (now {type(value).__name__})"
        else:
            if type(value) is not type(entry[1]) or value != entry[1]:
                return f"arg #{i}: {value!r} ({type(value).__name__}) now, {entry[1]!r} ({type(entry[1]).__name__}) at capture"
    return None


def make_guard(check_dtype=True, strict_type=True, check_kind=True, from_one=False, vague=False, check_len=True):
    def guard(expected, args):
        if check_len and len(args) != len(expected):
            return f"the step was captured with {len(expected)} arguments, this call passes {len(args)}"
        for k, (entry, arg) in enumerate(zip(expected, args)):
            pos = k + 1 if from_one else k
            kind = entry[0]
            if kind in ("tensor", "array"):
                if check_kind and not (isinstance(arg, T.Tensor) if kind == "tensor" else is_array(arg)):
                    return f"argument {pos} is a {type(arg).__name__}, the step was captured with a {kind}"
                if not hasattr(arg, "shape"):
                    return f"argument {pos} is a {type(arg).__name__}, the step was captured with a {kind}"
                dtype = np.dtype(arg.dtype).name if isinstance(arg, T.Tensor) else np.asarray(arg).dtype.name
                if tuple(arg.shape) != entry[1]:
                    if vague:
                        return f"argument {pos} differs"
                    return f"argument {pos} has shape {tuple(arg.shape)}, the step was captured with shape {entry[1]}"
                if check_dtype and dtype != entry[2]:
                    return f"argument {pos} has dtype {dtype}, the step was captured with {entry[2]}"
            elif kind == "object":
                if arg is not entry[1]:
                    return f"argument {pos} is another {type(arg).__name__} than the one the step was captured with"
            else:
                differs = (type(arg) is not type(entry[1]) or arg != entry[1]) if strict_type else arg != entry[1]
                if differs:
                    return f"argument {pos} is {arg!r}, the step was captured with {entry[1]!r}"
        return None
    return guard

# ---------------------------------------------------------------- chapter 13's cases

ACCEPT_13 = [
    case("record_lookup_first", ch13.record, record_lookup_first),
    case("can_join_lesson_careful_rule", ch13.can_join, can_join_careful),
    case("can_join_rows", ch13.can_join, can_join_rows),
    case("pointwise_flat_index", ch13.pointwise_source, pointwise_flat_index),
    case("pointwise_one_loop_over_elements", ch13.pointwise_source, pointwise_one_loop),
    case("pointwise_row_blocks", ch13.pointwise_source, pointwise_row_blocks),
    case("guard_my_words", ch13.guard, guard_my_words),
]

REJECT_13 = [
    case("record_const_not_copied", ch13.record, make_record(copy_const=False)),
    case("record_buffer_per_view", ch13.record, make_record(by_view=True)),
    case("record_no_after", ch13.record, make_record(after=False)),
    case("record_drops_attrs", ch13.record, make_record(keep_attrs=False)),
    case("record_into_new_temp", ch13.record, make_record(into_new=True)),
    case("can_join_any_view", ch13.can_join, can_join_any_view),
    case("can_join_no_order", ch13.can_join, can_join_no_order),
    case("can_join_any_dim", ch13.can_join, can_join_any_dim),
    case("can_join_never", ch13.can_join, can_join_never),
    case("pointwise_columns_parallel", ch13.pointwise_source, pointwise_columns_parallel),
    case("pointwise_prange_of_one", ch13.pointwise_source, pointwise_prange_of_one),
    case("pointwise_col_by_j", ch13.pointwise_source, pointwise_col_by_j),
    case("guard_ignores_dtype", ch13.guard, make_guard(check_dtype=False)),
    case("guard_equal_not_same", ch13.guard, make_guard(strict_type=False)),
    case("guard_ignores_kind", ch13.guard, make_guard(check_kind=False)),
    case("guard_counts_from_one", ch13.guard, make_guard(from_one=True)),
    case("guard_vague", ch13.guard, make_guard(vague=True)),
    case("guard_no_length", ch13.guard, make_guard(check_len=False)),
]


ACCEPT = ACCEPT_06 + ACCEPT_10 + ACCEPT_11 + ACCEPT_12 + ACCEPT_13
REJECT = REJECT_06 + REJECT_10 + REJECT_11 + REJECT_12 + REJECT_13


@pytest.mark.parametrize("check, answers", ACCEPT)
def test_a_correct_answer_written_differently_passes(check, answers):
    expect_pass(check, *answers)


@pytest.mark.parametrize("check, answers", REJECT)
def test_a_wrong_answer_is_refused(check, answers):
    expect_failure(check, *answers)
