"""Chapter 06's checks pass on reference kernels and reject plausible mistakes (exercises 1-6, then the
fast paths of exercises 7-11)."""

import numba
import numpy as np
import pytest
from checking import expect_failure, expect_pass
from numba import njit, prange

from course_lib.checks import ch06 as check

# ---- reference answers (the same code as solutions/06_numba_cpu.ipynb) ----------------------

@njit(cache=True)
def softplus(x, out):
    for i in range(x.size):
        out[i] = max(x[i], 0.0) + np.log1p(np.exp(-abs(x[i])))
    return out


@njit(cache=True)
def position(ordinal, shape, strides, offset):
    ordinal = np.int64(ordinal)
    pos = offset
    for d in range(len(shape) - 1, -1, -1):
        pos += (ordinal % shape[d]) * strides[d]
        ordinal //= shape[d]
    return pos


@njit(parallel=True, cache=True)
def strided_map(fn, out, out_shape, out_strides, a, a_strides):
    size = 1
    for n in out_shape:
        size *= n
    for i in prange(size):
        out[position(i, out_shape, out_strides, 0)] = fn(a[position(i, out_shape, a_strides, 0)])


@njit(cache=True)
def broadcast_position(ordinal, out_shape, shape, strides):
    ordinal = np.int64(ordinal)
    pos = 0
    extra = len(out_shape) - len(shape)
    for d in range(len(out_shape) - 1, -1, -1):
        index = ordinal % out_shape[d]
        ordinal //= out_shape[d]
        if d >= extra and shape[d - extra] != 1:
            pos += index * strides[d - extra]
    return pos


@njit(parallel=True, cache=True)
def strided_zip(fn, out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
    size = 1
    for n in out_shape:
        size *= n
    for i in prange(size):
        out[position(i, out_shape, out_strides, 0)] = fn(a[broadcast_position(i, out_shape, a_shape, a_strides)],
                                                         b[broadcast_position(i, out_shape, b_shape, b_strides)])


@njit(parallel=True, cache=True)
def sum_kernel(out, out_shape, a, a_strides, dim, n):
    for i in prange(out.size):
        start = position(i, out_shape, a_strides, 0)
        acc = 0.0
        for k in range(n):
            acc += a[start + k * a_strides[dim]]
        out[i] = acc


def sum_dim(a, shape, strides, dim):
    out_shape = shape.copy()
    out_shape[dim] = 1
    out = np.empty(int(np.prod(out_shape)))
    sum_kernel(out, out_shape, a, strides, dim, shape[dim])
    return out.reshape(out_shape)


@njit(parallel=True, cache=True)
def matmul(out, a, b):
    n, k = a.shape
    m = b.shape[1]
    for i in prange(n):
        out[i, :] = 0.0
        for kk in range(k):
            aik = a[i, kk]
            for j in range(m):
                out[i, j] += aik * b[kk, j]


def test_reference_passes(capsys):
    check.softplus(softplus)
    check.position(position)
    check.strided_map(strided_map)
    check.strided_zip(strided_zip)
    check.sum_dim(sum_dim, sum_kernel)
    check.matmul(matmul)
    assert capsys.readouterr().out.count("passed") == 6


def stub(*args):
    raise NotImplementedError("Exercise: replace this line with your code")


@pytest.mark.parametrize("name", ["softplus", "position", "strided_map", "strided_zip", "sum_dim", "matmul"])
def test_stubs_fail(name):
    if name == "sum_dim":  # the Python wrapper and the kernel, both stubs
        args = (stub, njit(parallel=True)(stub))
    else:
        args = (njit(parallel=name in ("strided_map", "strided_zip", "matmul"))(stub),)
    expect_failure(getattr(check, name), *args, match="not implemented yet")


# ---- 1. softplus ------------------------------------------------------------------------------

@njit(cache=True)
def softplus_naive(x, out):
    for i in range(x.size):
        out[i] = np.log(1.0 + np.exp(x[i]))


@njit(cache=True)
def softplus_no_max(x, out):
    for i in range(x.size):
        out[i] = np.log1p(np.exp(-abs(x[i])))


def softplus_python(x, out):
    out[:] = np.logaddexp(0, x)


@pytest.mark.parametrize("wrong, hint", [(softplus_naive, "overflows"), (softplus_no_max, "max(x, 0)"),
                                         (softplus_python, "@njit")])
def test_softplus_rejects(wrong, hint):
    expect_failure(check.softplus, wrong, match=hint)


# ---- 2. position ------------------------------------------------------------------------------

@njit(cache=True)
def position_contiguous(ordinal, shape, strides, offset):
    return offset + ordinal


@njit(cache=True)
def position_no_offset(ordinal, shape, strides, offset):
    return position(ordinal, shape, strides, 0)


@njit(cache=True)
def position_first_dim_fastest(ordinal, shape, strides, offset):
    ordinal = np.int64(ordinal)
    pos = offset
    for d in range(len(shape)):
        pos += (ordinal % shape[d]) * strides[d]
        ordinal //= shape[d]
    return pos


@njit(cache=True)
def position_unsigned(ordinal, shape, strides, offset):
    pos = offset
    for d in range(len(shape) - 1, -1, -1):
        pos += (ordinal % shape[d]) * strides[d]
        ordinal //= shape[d]
    return pos


@pytest.mark.parametrize("wrong, hint", [(position_contiguous, "ignored the strides"),
                                         (position_unsigned, "np.int64(ordinal)"),
                                         (position_no_offset, "offset"),
                                         (position_first_dim_fastest, "differs")])
def test_position_rejects(wrong, hint):
    expect_failure(check.position, wrong, match=hint)


# ---- 3. map -----------------------------------------------------------------------------------

@njit(parallel=True, cache=True)
def map_ignores_strides(fn, out, out_shape, out_strides, a, a_strides):
    size = 1
    for n in out_shape:
        size *= n
    for i in prange(size):
        out[position(i, out_shape, out_strides, 0)] = fn(a[i])


@njit(cache=True)
def map_serial(fn, out, out_shape, out_strides, a, a_strides):
    pass


@pytest.mark.parametrize("wrong, hint", [(map_ignores_strides, "as if it were contiguous"),
                                         (map_serial, "parallel=True")])
def test_strided_map_rejects(wrong, hint):
    expect_failure(check.strided_map, wrong, match=hint)


# ---- 4. zip -----------------------------------------------------------------------------------

@njit(parallel=True, cache=True)
def zip_no_broadcast(fn, out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
    size = 1
    for n in out_shape:
        size *= n
    for i in prange(size):
        out[position(i, out_shape, out_strides, 0)] = fn(a[position(i, a_shape, a_strides, 0)],
                                                         b[position(i, b_shape, b_strides, 0)])


@njit(parallel=True, cache=True)
def zip_swapped(fn, out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
    strided_zip(fn, out, out_shape, out_strides, b, b_shape, b_strides, a, a_shape, a_strides)


@pytest.mark.parametrize("wrong, hint", [(zip_no_broadcast, "broadcasting"), (zip_swapped, "swapped")])
def test_strided_zip_rejects(wrong, hint):
    expect_failure(check.strided_zip, wrong, match=hint)


# ---- 5. sum_dim -------------------------------------------------------------------------------

def sum_dim_drops_dim(a, shape, strides, dim):
    return sum_dim(a, shape, strides, dim).sum(axis=dim)


@njit(parallel=True, cache=True)
def racy_sum_kernel(out, out_shape, a, a_strides, dim, n):
    """The race: threads split the reduced dim and read-modify-write the same out element.

    The busy loop between the read and the write widens the race window, so that the race
    shows on every run even on a loaded 2-core machine (where it is otherwise rare)."""
    for i in range(out.size):
        start = position(i, out_shape, a_strides, 0)
        for k in prange(n):
            old = out[i]
            busy = 0.0
            for s in range(100):
                busy += np.sqrt(s + k)
            out[i] = old + a[start + k * a_strides[dim]] + busy * 0.0


def sum_dim_racy(a, shape, strides, dim):
    out_shape = shape.copy()
    out_shape[dim] = 1
    out = np.zeros(int(np.prod(out_shape)))
    racy_sum_kernel(out, out_shape, a, strides, dim, shape[dim])
    return out.reshape(out_shape)


def sum_dim_contiguous(a, shape, strides, dim):
    return sum_dim(a, shape, np.array([int(np.prod(shape[d + 1:])) for d in range(len(shape))]), dim)


def sum_dim_numpy(a, shape, strides, dim):
    """The right sums from numpy, with the kernel never called."""
    view = np.lib.stride_tricks.as_strided(a, tuple(shape), tuple(int(s) * a.itemsize for s in strides))
    return view.sum(axis=int(dim), keepdims=True)


@njit(parallel=True, cache=True)
def sum_kernel_idle(out, out_shape, a, a_strides, dim, n):
    for i in prange(out.size):
        out[i] = out[i]


@njit(cache=True)
def sum_kernel_serial(out, out_shape, a, a_strides, dim, n):
    for i in range(out.size):
        start = position(i, out_shape, a_strides, 0)
        acc = 0.0
        for k in range(n):
            acc += a[start + k * a_strides[dim]]
        out[i] = acc


@pytest.mark.parametrize("wrong, kernel, hint", [
    (sum_dim_drops_dim, sum_kernel, "keepdim"),
    (sum_dim_contiguous, sum_kernel, "ignored the strides"),
    (sum_dim_numpy, sum_kernel_idle, "compute the sums itself"),
    (sum_dim_numpy, sum_kernel_serial, "parallel=True"),
    (sum_dim_numpy, sum_kernel.py_func, "plain Python function"),
])
def test_sum_dim_rejects(wrong, kernel, hint):
    expect_failure(check.sum_dim, wrong, kernel, match=hint)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="a race needs at least 2 threads")
def test_sum_dim_rejects_a_race():
    """A race shows only when two threads overlap in time, which a busy machine may not allow.
    So: up to 4 tries; when it shows, the check must name it; when it never shows, skip (never pass)."""
    for _ in range(4):
        try:
            check.sum_dim(sum_dim_racy, racy_sum_kernel)
        except check.CheckFailed as e:
            assert "race" in str(e), f"the failure message lacks 'race':\n{e}"
            return
    pytest.skip("the race never lost an update in 4 tries on this machine (the threads did not overlap)")


# ---- 6. matmul --------------------------------------------------------------------------------

@njit(parallel=True, cache=True)
def matmul_no_zero(out, a, b):
    n, k = a.shape
    for i in prange(n):
        for kk in range(k):
            for j in range(b.shape[1]):
                out[i, j] += a[i, kk] * b[kk, j]


@njit(parallel=True, cache=True)
def matmul_wrong_index(out, a, b):
    n, k = a.shape
    for i in prange(n):
        for j in range(b.shape[1]):
            acc = 0.0
            for kk in range(k):
                acc += a[i, kk] * b[j % k, kk % b.shape[1]]
            out[i, j] = acc


@njit(cache=True)
def matmul_serial(out, a, b):
    out[:] = a @ b


@pytest.mark.parametrize("wrong, hint", [(matmul_no_zero, "not zero"), (matmul_wrong_index, "differs"),
                                         (matmul_serial, "parallel=True")])
def test_matmul_rejects(wrong, hint):
    expect_failure(check.matmul, wrong, match=hint)


# ---- fixed adversarial cases (drawn on every run) ---------------------------------------------

@njit(cache=True)
def softplus_patched_overflow(x, out):
    """Patches only the overflow: log(1 + exp(x)) is 0 below about -37, where softplus is exp(x)."""
    for i in range(x.size):
        out[i] = x[i] if x[i] > 709.0 else np.log(1.0 + np.exp(x[i]))


@njit(cache=True)
def softplus_log_not_log1p(x, out):
    for i in range(x.size):
        out[i] = max(x[i], 0.0) + np.log(1.0 + np.exp(-abs(x[i])))


@njit(cache=True)
def softplus_cut_off_at_20(x, out):
    for i in range(x.size):
        out[i] = x[i] if x[i] > 20.0 else np.log1p(np.exp(x[i]))


@pytest.mark.parametrize("wrong, hint", [(softplus_patched_overflow, "below about -37"),
                                         (softplus_log_not_log1p, "below about -37"),
                                         (softplus_cut_off_at_20, "x > 20")])
def test_softplus_rejects_every_branch(wrong, hint):
    expect_failure(check.softplus, wrong, match=hint)


@njit(cache=True)
def broadcast_position_left_aligned(ordinal, out_shape, shape, strides):
    """Pairs operand dim d with output dim d: numpy aligns on the RIGHT."""
    ordinal = np.int64(ordinal)
    pos = 0
    for d in range(len(out_shape) - 1, -1, -1):
        index = ordinal % out_shape[d]
        ordinal //= out_shape[d]
        if d < len(shape) and shape[d] != 1:
            pos += index * strides[d]
    return pos


@njit(parallel=True, cache=True)
def zip_left_aligned(fn, out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
    size = 1
    for n in out_shape:
        size *= n
    for i in prange(size):
        out[position(i, out_shape, out_strides, 0)] = fn(
            a[broadcast_position_left_aligned(i, out_shape, a_shape, a_strides)],
            b[broadcast_position_left_aligned(i, out_shape, b_shape, b_strides)])


def test_strided_zip_rejects_left_alignment():
    expect_failure(check.strided_zip, zip_left_aligned, match="align the shapes on the right")


@njit(parallel=True, cache=True)
def matmul_prange_over_k(out, a, b):
    """The race: prange over the reduction dim, so threads add into the same out[i, j]."""
    n, k = a.shape
    m = b.shape[1]
    for i in range(n):
        for j in range(m):
            out[i, j] = 0.0
        for kk in prange(k):
            aik = a[i, kk]
            for j in range(m):
                out[i, j] += aik * b[kk, j]


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="a race needs at least 2 threads")
def test_matmul_rejects_a_race():
    """Up to 4 tries, as for the sum: when the race shows, the check must name it; never a pass."""
    for _ in range(4):
        try:
            check.matmul(matmul_prange_over_k)
        except check.CheckFailed as e:
            assert "race" in str(e), f"the failure message lacks 'race':\n{e}"
            return
    pytest.skip("the race never lost an update in 4 tries on this machine (the threads did not overlap)")


# ==== exercises 7-11: the fast paths =================================================================
# Reference answers (as in solutions/06_numba_cpu.ipynb), then plausible mistakes, including a product
# that copies an operand gemm reads in place (right values, wrong memory).

@njit(cache=True)
def flat_map(fn, out, a):
    for i in range(out.size):
        out[i] = fn(a[i])


@njit(cache=True)
def flat_zip(fn, out, cols, a, a_row, a_spread, b, b_row, b_spread):
    for r in range(out.size // cols):
        o, x, y = out[r * cols:(r + 1) * cols], a[r * a_row:], b[r * b_row:]
        for j in range(cols):
            o[j] = fn(x[j if a_spread else 0], y[j if b_spread else 0])


def row_layout(shape, out_shape, mistake=None):
    shape, out_shape = tuple(shape), tuple(out_shape)
    cols = out_shape[-1] if out_shape else 1
    padded = shape if mistake == "no padding" else (1,) * (len(out_shape) - len(shape)) + shape
    if padded == out_shape:
        return cols, True
    if mistake == "full only":
        return None
    if int(np.prod(shape)) == 1:
        return 0, False
    if padded[:-1] == (1,) * (len(padded) - 1) and padded[-1] == cols:
        return 0, True
    if mistake == "column is a row" and padded[-1] == 1:
        return 0, True
    if padded[-1] == 1 and (padded[:-1] == out_shape[:-1] or mistake == "any column"):
        return 1, False
    return None


@njit(cache=True)
def strided_copy(out, out_shape, out_strides, a, a_strides):
    n = out_shape[-1]
    size = 1
    for s in out_shape:
        size *= s
    step_out, step_a = out_strides[-1], a_strides[-1]
    for r in range(size // n if n else 0):
        po = position(r * n, out_shape, out_strides, 0)
        pa = position(r * n, out_shape, a_strides, 0)
        for j in range(n):
            out[po + j * step_out] = a[pa + j * step_a]


@njit(cache=True)
def sum_columns(out, a, n, m):
    for o in range(out.size // m):
        acc = out[o * m:(o + 1) * m]
        acc[:] = 0.0
        for k in range(n):
            row = a[(o * n + k) * m:(o * n + k + 1) * m]
            for j in range(m):
                acc[j] += row[j]


def _view(storage, shape, strides):
    return np.lib.stride_tricks.as_strided(storage, tuple(shape), tuple(int(s) * storage.itemsize for s in strides))


def blas_matmul(a, a_shape, a_strides, b, b_shape, b_strides):
    return np.matmul(_view(a, a_shape, a_strides), _view(b, b_shape, b_strides))


def test_fast_path_references_pass():
    expect_pass(check.flat_kernels, flat_map, flat_zip)
    expect_pass(check.row_layout, row_layout)
    expect_pass(check.strided_copy, strided_copy)
    expect_pass(check.sum_columns, sum_columns)
    expect_pass(check.blas_matmul, blas_matmul)


@pytest.mark.parametrize("name, args", [
    ("flat_kernels", (njit(stub), njit(stub))), ("row_layout", (stub,)), ("strided_copy", (njit(stub),)),
    ("sum_columns", (njit(stub),)), ("blas_matmul", (stub,))])
def test_fast_path_stubs_fail(name, args):
    expect_failure(getattr(check, name), *args, match="not implemented yet")


# ---- 7. flat kernels ------------------------------------------------------------------------------

@njit(cache=True)
def flat_zip_swapped(fn, out, cols, a, a_row, a_spread, b, b_row, b_spread):
    for r in range(out.size // cols):
        o, x, y = out[r * cols:(r + 1) * cols], a[r * a_row:], b[r * b_row:]
        for j in range(cols):
            o[j] = fn(y[j if b_spread else 0], x[j if a_spread else 0])


@njit(cache=True)
def flat_zip_full_rows(fn, out, cols, a, a_row, a_spread, b, b_row, b_spread):
    """Every operand's row r starts at r * cols, as if it had the output's shape."""
    for r in range(out.size // cols):
        o, x, y = out[r * cols:(r + 1) * cols], a[r * cols:], b[r * cols:]
        for j in range(cols):
            o[j] = fn(x[j if a_spread else 0], y[j if b_spread else 0])


@njit(cache=True)
def flat_zip_always_spread(fn, out, cols, a, a_row, a_spread, b, b_row, b_spread):
    for r in range(out.size // cols):
        o, x, y = out[r * cols:(r + 1) * cols], a[r * a_row:], b[r * b_row:]
        for j in range(cols):
            o[j] = fn(x[j], y[j])


@njit(cache=True)
def flat_zip_one_row_too_many(fn, out, cols, a, a_row, a_spread, b, b_row, b_spread):
    size = out.size
    for r in range(size // cols + 1):
        for j in range(cols):
            out[r * cols + j] = fn(a[r * a_row + (j if a_spread else 0)], b[r * b_row + (j if b_spread else 0)])


def flat_map_python(fn, out, a):
    for i in range(out.size):
        out[i] = fn(a[i])


@pytest.mark.parametrize("wrong_map, wrong_zip, hint", [
    (flat_map, flat_zip_swapped, "swapped"),
    (flat_map, flat_zip_full_rows, "r * row_step"),
    (flat_map, flat_zip_always_spread, "spread"),
    (flat_map, flat_zip_one_row_too_many, "outside its output"),
    (flat_map_python, flat_zip, "@njit"),
])
def test_flat_kernels_reject(wrong_map, wrong_zip, hint):
    expect_failure(check.flat_kernels, wrong_map, wrong_zip, match=hint)


# ---- 8. row_layout -----------------------------------------------------------------------------------

@pytest.mark.parametrize("mistake, hint", [
    ("no padding", "pad the shape"),
    ("full only", "reads flat"),
    ("column is a row", "differs"),
    ("any column", "return None there"),
])
def test_row_layout_rejects(mistake, hint):
    expect_failure(check.row_layout, lambda s, o: row_layout(s, o, mistake=mistake), match=hint)


def test_row_layout_rejects_a_bad_result():
    expect_failure(check.row_layout, lambda s, o: "full", match="(row_step, spread)")


# ---- 9. strided_copy -----------------------------------------------------------------------------------

@njit(cache=True)
def copy_ignoring_a_strides(out, out_shape, out_strides, a, a_strides):
    n = out_shape[-1]
    size = 1
    for s in out_shape:
        size *= s
    for r in range(size // n if n else 0):
        po = position(r * n, out_shape, out_strides, 0)
        for j in range(n):
            out[po + j * out_strides[-1]] = a[r * n + j]


@njit(cache=True)
def copy_into_contiguous(out, out_shape, out_strides, a, a_strides):
    n = out_shape[-1]
    size = 1
    for s in out_shape:
        size *= s
    for r in range(size // n if n else 0):
        pa = position(r * n, out_shape, a_strides, 0)
        for j in range(n):
            out[r * n + j] = a[pa + j * a_strides[-1]]


@njit(cache=True)
def copy_dividing_by_the_last_dim(out, out_shape, out_strides, a, a_strides):
    n = out_shape[-1]
    size = 1
    for s in out_shape:
        size *= s
    for r in range(size // n):
        po = position(r * n, out_shape, out_strides, 0)
        pa = position(r * n, out_shape, a_strides, 0)
        for j in range(n):
            out[po + j * out_strides[-1]] = a[pa + j * a_strides[-1]]


def copy_in_python(out, out_shape, out_strides, a, a_strides):
    strided_copy(out, out_shape, out_strides, a, a_strides)


@pytest.mark.parametrize("wrong, hint", [
    (copy_ignoring_a_strides, "as if it were contiguous"),
    (copy_into_contiguous, "differs"),
    (copy_dividing_by_the_last_dim, "raised"),
    (copy_in_python, "@njit"),
])
def test_strided_copy_rejects(wrong, hint):
    expect_failure(check.strided_copy, wrong, match=hint)


# ---- 10. sum_columns ----------------------------------------------------------------------------------

@njit(cache=True)
def sum_columns_not_zeroed(out, a, n, m):
    for o in range(out.size // m):
        acc = out[o * m:(o + 1) * m]
        for k in range(n):
            row = a[(o * n + k) * m:(o * n + k + 1) * m]
            for j in range(m):
                acc[j] += row[j]


@njit(cache=True)
def sum_columns_first_block(out, a, n, m):
    for o in range(out.size // m):
        acc = out[o * m:(o + 1) * m]
        acc[:] = 0.0
        for k in range(n):
            row = a[k * m:(k + 1) * m]
            for j in range(m):
                acc[j] += row[j]


@njit(cache=True)
def sum_rows_instead(out, a, n, m):
    for i in range(out.size):
        acc = 0.0
        for j in range(n):
            acc += a[i * n + j]
        out[i] = acc


@pytest.mark.parametrize("wrong, hint", [
    (sum_columns_not_zeroed, "not zero"),
    (sum_columns_first_block, "first block"),
    (sum_rows_instead, "differs"),
])
def test_sum_columns_rejects(wrong, hint):
    expect_failure(check.sum_columns, wrong, match=hint)


# ---- 11. blas_matmul ----------------------------------------------------------------------------------

def matmul_copying(a, a_shape, a_strides, b, b_shape, b_strides):
    """Right values, wrong memory: every operand made contiguous first, the transposed weight too."""
    return np.matmul(np.ascontiguousarray(_view(a, a_shape, a_strides)), np.ascontiguousarray(_view(b, b_shape, b_strides)))


def matmul_ignoring_strides(a, a_shape, a_strides, b, b_shape, b_strides):
    return np.matmul(a[:int(np.prod(a_shape))].reshape(a_shape), b[:int(np.prod(b_shape))].reshape(b_shape))


def matmul_in_float64(a, a_shape, a_strides, b, b_shape, b_strides):
    return blas_matmul(a, a_shape, a_strides, b, b_shape, b_strides).astype(np.float64)


@njit(cache=True)
def matmul_in_numba(a, a_shape, a_strides, b, b_shape, b_strides):
    return a


@pytest.mark.parametrize("wrong, hint", [
    (matmul_copying, "copy of an operand"),
    (matmul_ignoring_strides, "as if they were contiguous"),
    (matmul_in_float64, "came back as float64"),
    (matmul_in_numba, "compiled with Numba"),
])
def test_blas_matmul_rejects(wrong, hint):
    expect_failure(check.blas_matmul, wrong, match=hint)
