"""Chapter 06: fresh answers (scratch for the audit)."""

import numpy as np
import pytest
from numba import njit, prange

from checking import expect_failure, expect_pass
from course_lib.checks import ch06 as check


@pytest.fixture(autouse=True)
def _isolated(workspace):
    """A passing check saves the answer: keep it in a temporary workspace."""


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
def map_serial(fn, out, out_shape, out_strides, a, a_strides):   # wrong property: a serial range under parallel=True
    total = 1
    for s in out_shape:
        total *= s
    for i in range(total):
        out[position(i, out_shape, out_strides, 0)] = fn(a[position(i, out_shape, a_strides, 0)])


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
def matmul_no_zero(out, a, b):                   # wrong: out holds garbage
    n, kk = a.shape
    m = b.shape[1]
    for i in prange(n):
        for k in range(kk):
            x = a[i, k]
            for j in range(m):
                out[i, j] += x * b[k, j]


@njit(parallel=True)
def matmul_ijk(out, a, b):                       # the order the exercise rules out: dot products down b's columns
    n, kk = a.shape
    m = b.shape[1]
    for i in prange(n):
        for j in range(m):
            s = 0.0
            for k in range(kk):
                s += a[i, k] * b[k, j]
            out[i, j] = s


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


@njit
def flat_zip_by_index(fn, out, cols, a, a_row, a_spread, b, b_row, b_spread):   # right numbers, no slices
    for r in range(len(out) // cols):
        for j in range(cols):
            out[r * cols + j] = fn(a[r * a_row + (j if a_spread else 0)], b[r * b_row + (j if b_spread else 0)])


@njit(parallel=True)
def flat_zip_prange(fn, out, cols, a, a_row, a_spread, b, b_row, b_spread):   # parallel, where a plain njit is asked
    for r in prange(len(out) // cols):
        o, x, y = out[r * cols:(r + 1) * cols], a[r * a_row:], b[r * b_row:]
        for j in range(cols):
            o[j] = fn(x[j if a_spread else 0], y[j if b_spread else 0])


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
def copy_per_element(out, out_shape, out_strides, a, a_strides):   # right numbers, two positions per element
    total = 1
    for s in out_shape:
        total *= s
    for i in range(total):
        out[position(i, out_shape, out_strides, 0)] = a[position(i, out_shape, a_strides, 0)]


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
def sum_columns_by_column(out, a, n, m):         # right numbers, the column walk the exercise turns around
    for o in range(len(out) // m):
        for j in range(m):
            acc = 0.0
            for k in range(n):
                acc += a[(o * n + k) * m + j]
            out[o * m + j] = acc


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


def blas_einsum(a, a_shape, a_strides, b, b_shape, b_strides):   # no BLAS: einsum's own loops, no copy
    def view(x, shape, strides):
        return np.lib.stride_tricks.as_strided(x, tuple(shape), tuple(int(s) * x.itemsize for s in strides))
    return np.einsum("...ij,...jk->...ik", view(a, a_shape, a_strides), view(b, b_shape, b_strides))


# ---------------------------------------------------------------- the cases

ACCEPT = [
    ("softplus", lambda: check.softplus(softplus_branches)),
    ("position", lambda: check.position(position)),
    ("position_divisors", lambda: check.position(position_front_divisors)),
    ("strided_map", lambda: check.strided_map(map_two_positions_at_once)),
    ("strided_zip", lambda: check.strided_zip(zip_expanded_strides)),
    ("sum_dim", lambda: check.sum_dim(sum_dim_list, sum_kernel_backwards)),
    ("matmul", lambda: check.matmul(matmul_row_buffer)),
    ("flat_kernels", lambda: check.flat_kernels(flat_map_ok, flat_zip_four_cases)),
    ("row_layout", lambda: check.row_layout(row_layout_by_strides)),
    ("strided_copy", lambda: check.strided_copy(copy_odometer)),
    ("sum_columns", lambda: check.sum_columns(sum_columns_zero_first)),
    ("blas_matmul", lambda: check.blas_matmul(blas_ndarray_views)),
]

REJECT = [
    ("softplus_naive", lambda: check.softplus(softplus_naive)),
    ("softplus_log_not_log1p", lambda: check.softplus(softplus_log_not_log1p)),
    ("softplus_python", lambda: check.softplus(softplus_python)),
    ("position_first_dim_first", lambda: check.position(position_first_dim_first)),
    ("position_unsigned", lambda: check.position(position_unsigned)),
    ("position_no_offset", lambda: check.position(position_no_offset)),
    ("map_serial", lambda: check.strided_map(map_serial)),
    ("map_out_strides_for_a", lambda: check.strided_map(map_out_strides_for_a)),
    ("zip_strides_only", lambda: check.strided_zip(zip_strides_only)),
    ("zip_serial", lambda: check.strided_zip(zip_serial)),
    ("zip_left_aligned", lambda: check.strided_zip(zip_left_aligned)),
    ("sum_dim_numpy", lambda: check.sum_dim(sum_dim_numpy, sum_kernel_ok)),
    ("sum_kernel_serial", lambda: check.sum_dim(make_sum_dim(sum_kernel_serial), sum_kernel_serial)),
    ("sum_kernel_race", lambda: check.sum_dim(make_sum_dim(sum_kernel_race), sum_kernel_race)),
    ("sum_kernel_contiguous_start", lambda: check.sum_dim(make_sum_dim(sum_kernel_contiguous_start),
                                                          sum_kernel_contiguous_start)),
    ("matmul_serial", lambda: check.matmul(matmul_serial)),
    ("matmul_k_outer", lambda: check.matmul(matmul_k_outer)),
    ("matmul_no_zero", lambda: check.matmul(matmul_no_zero)),
    ("matmul_ijk", lambda: check.matmul(matmul_ijk)),
    ("flat_zip_all_spread", lambda: check.flat_kernels(flat_map_ok, flat_zip_all_spread)),
    ("flat_zip_by_index", lambda: check.flat_kernels(flat_map_ok, flat_zip_by_index)),
    ("flat_zip_prange", lambda: check.flat_kernels(flat_map_ok, flat_zip_prange)),
    ("row_layout_loose_column", lambda: check.row_layout(row_layout_loose_column)),
    ("row_layout_loose_row", lambda: check.row_layout(row_layout_loose_row)),
    ("row_layout_no_0d", lambda: check.row_layout(row_layout_no_0d)),
    ("copy_per_element", lambda: check.strided_copy(copy_per_element)),
    ("copy_divides_by_zero", lambda: check.strided_copy(copy_divides_by_zero)),
    ("copy_one_stride", lambda: check.strided_copy(copy_one_stride)),
    ("sum_columns_by_column", lambda: check.sum_columns(sum_columns_by_column)),
    ("sum_columns_no_zero", lambda: check.sum_columns(sum_columns_no_zero)),
    ("blas_contiguous_copies", lambda: check.blas_matmul(blas_contiguous_copies)),
    ("blas_byte_strides_forgotten", lambda: check.blas_matmul(blas_byte_strides_forgotten)),
    ("blas_einsum", lambda: check.blas_matmul(blas_einsum)),
]


@pytest.mark.parametrize("name, run", ACCEPT, ids=[c[0] for c in ACCEPT])
def test_accept(name, run):
    run()


@pytest.mark.parametrize("name, run", REJECT, ids=[c[0] for c in REJECT])
def test_reject(name, run):
    from course_lib.checks import CheckFailed
    with pytest.raises(CheckFailed) as info:
        run()
    print(str(info.value)[:600])
