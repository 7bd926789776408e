"""Chapter 06's checks pass on reference kernels and reject plausible mistakes (exercises 1-6, then the
fast paths of exercises 7-11)."""

import numba
import numpy as np
import pytest
from checking import expect_failure, expect_pass
from edits import edited
from numba import njit, prange
from numpy.lib.stride_tricks import as_strided

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

# Most wrong implementations below are the reference with one mistake edited in (tests/edits.py).
softplus_naive = edited(softplus, "softplus_naive",
                        ("max(x[i], 0.0) + np.log1p(np.exp(-abs(x[i])))", "np.log(1.0 + np.exp(x[i]))"))
softplus_no_max = edited(softplus, "softplus_no_max", ("max(x[i], 0.0) + ", ""))
softplus_python = edited(softplus, "softplus_python", ("@njit(cache=True)\n", ""))


@pytest.mark.parametrize("wrong, hint", [(softplus_naive, "overflows"), (softplus_no_max, "max(x, 0)"),
                                         (softplus_python, "@njit")])
def test_softplus_rejects(wrong, hint):
    expect_failure(check.softplus, wrong, match=hint)


# ---- 2. position ------------------------------------------------------------------------------

@njit(cache=True)
def position_contiguous(ordinal, shape, strides, offset):
    return offset + ordinal


position_no_offset = edited(position, "position_no_offset", ("pos = offset", "pos = 0"))
position_first_dim_fastest = edited(position, "position_first_dim_fastest",
                                    ("range(len(shape) - 1, -1, -1)", "range(len(shape))"))
position_unsigned = edited(position, "position_unsigned", ("    ordinal = np.int64(ordinal)\n", ""))


@pytest.mark.parametrize("wrong, hint", [(position_contiguous, "ignored the strides"),
                                         (position_unsigned, "signed ordinal"),
                                         (position_no_offset, "offset"),
                                         (position_first_dim_fastest, "differs")])
def test_position_rejects(wrong, hint):
    expect_failure(check.position, wrong, match=hint)


# ---- 3. map -----------------------------------------------------------------------------------

map_ignores_strides = edited(strided_map, "map_ignores_strides",
                             ("fn(a[position(i, out_shape, a_strides, 0)])", "fn(a[i])"))
map_serial = edited(strided_map, "map_serial", ("@njit(parallel=True, cache=True)", "@njit(cache=True)"))


@pytest.mark.parametrize("wrong, hint", [(map_ignores_strides, "as if it were contiguous"),
                                         (map_serial, "parallel=True")])
def test_strided_map_rejects(wrong, hint):
    expect_failure(check.strided_map, wrong, match=hint)


# ---- 4. zip -----------------------------------------------------------------------------------

zip_no_broadcast = edited(strided_zip, "zip_no_broadcast",
                          ("broadcast_position(i, out_shape, a_shape, a_strides)", "position(i, a_shape, a_strides, 0)"),
                          ("broadcast_position(i, out_shape, b_shape, b_strides)", "position(i, b_shape, b_strides, 0)"))


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


sum_dim_racy = edited(sum_dim, "sum_dim_racy", ("np.empty(", "np.zeros("), ("sum_kernel(", "racy_sum_kernel("))


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


sum_kernel_serial = edited(sum_kernel, "sum_kernel_serial", ("@njit(parallel=True, cache=True)", "@njit(cache=True)"),
                           ("prange(out.size)", "range(out.size)"))


def sum_dim_numpy_after_the_kernel(a, shape, strides, dim):
    """Runs the (idle) kernel, then returns numpy's sums: the kernel ran, but the sums are not its."""
    out_shape = shape.copy()
    out_shape[dim] = 1
    sum_kernel_idle(np.zeros(int(np.prod(out_shape))), out_shape, a, strides, dim, shape[dim])
    return sum_dim_numpy(a, shape, strides, dim)


@pytest.mark.parametrize("wrong, kernel, hint", [
    (sum_dim_drops_dim, sum_kernel, "keepdim"),
    (sum_dim_contiguous, sum_kernel, "ignored the strides"),
    (sum_dim_numpy_after_the_kernel, sum_kernel_idle, "compute the sums itself"),
    (sum_dim_numpy, sum_kernel, "without calling your sum_kernel"),   # the right sums, the kernel never run
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

matmul_no_zero = edited(matmul, "matmul_no_zero", ("        out[i, :] = 0.0\n", ""))
matmul_wrong_index = edited(matmul, "matmul_wrong_index", ("b[kk, j]", "b[j % k, kk % m]"))
matmul_serial = edited(matmul, "matmul_serial", ("@njit(parallel=True, cache=True)", "@njit(cache=True)"),
                       ("prange(n)", "range(n)"))


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


softplus_log_not_log1p = edited(softplus, "softplus_log_not_log1p", ("np.log1p(", "np.log(1.0 + "))


@njit(cache=True)
def softplus_cut_off_at_20(x, out):
    for i in range(x.size):
        out[i] = x[i] if x[i] > 20.0 else np.log1p(np.exp(x[i]))


@pytest.mark.parametrize("wrong, hint", [(softplus_patched_overflow, "below about -37"),
                                         (softplus_log_not_log1p, "below about -37"),
                                         (softplus_cut_off_at_20, "x > 20")])
def test_softplus_rejects_every_branch(wrong, hint):
    expect_failure(check.softplus, wrong, match=hint)


# pairs operand dim d with output dim d: numpy aligns on the RIGHT
broadcast_position_left_aligned = edited(broadcast_position, "broadcast_position_left_aligned",
                                         ("d >= extra and shape[d - extra] != 1", "d < len(shape) and shape[d] != 1"),
                                         ("strides[d - extra]", "strides[d]"))
zip_left_aligned = edited(strided_zip, "zip_left_aligned", env={"broadcast_position": broadcast_position_left_aligned})


def test_strided_zip_rejects_left_alignment():
    expect_failure(check.strided_zip, zip_left_aligned, match="align the shapes on the right")


# the race: prange over the reduction dim, so threads add into the same out[i, j]
matmul_prange_over_k = edited(matmul, "matmul_prange_over_k", ("prange(n)", "range(n)"), ("range(k)", "prange(k)"))


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

PAIR = "fn(x[j if a_spread else 0], y[j if b_spread else 0])"
flat_zip_swapped = edited(flat_zip, "flat_zip_swapped", (PAIR, "fn(y[j if b_spread else 0], x[j if a_spread else 0])"))
# every operand's row r starts at r * cols, as if it had the output's shape
flat_zip_full_rows = edited(flat_zip, "flat_zip_full_rows", ("a[r * a_row:], b[r * b_row:]", "a[r * cols:], b[r * cols:]"))
flat_zip_always_spread = edited(flat_zip, "flat_zip_always_spread", (PAIR, "fn(x[j], y[j])"))
flat_zip_one_row_too_many = edited(flat_zip, "flat_zip_one_row_too_many",
                                   ("range(out.size // cols)", "range(out.size // cols + 1)"))
flat_map_python = edited(flat_map, "flat_map_python", ("@njit(cache=True)\n", ""))


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

copy_ignoring_a_strides = edited(strided_copy, "copy_ignoring_a_strides", ("a[pa + j * step_a]", "a[r * n + j]"))
copy_into_contiguous = edited(strided_copy, "copy_into_contiguous", ("out[po + j * step_out]", "out[r * n + j]"))
# an empty last dim divides by zero
copy_dividing_by_the_last_dim = edited(strided_copy, "copy_dividing_by_the_last_dim",
                                       ("range(size // n if n else 0)", "range(size // n)"))
copy_in_python = edited(strided_copy, "copy_in_python", ("@njit(cache=True)\n", ""))


@pytest.mark.parametrize("wrong, hint", [
    (copy_ignoring_a_strides, "as if it were contiguous"),
    (copy_into_contiguous, "differs"),
    (copy_dividing_by_the_last_dim, "raised"),
    (copy_in_python, "@njit"),
])
def test_strided_copy_rejects(wrong, hint):
    expect_failure(check.strided_copy, wrong, match=hint)


# ---- 10. sum_columns ----------------------------------------------------------------------------------

sum_columns_not_zeroed = edited(sum_columns, "sum_columns_not_zeroed", ("        acc[:] = 0.0\n", ""))
sum_columns_first_block = edited(sum_columns, "sum_columns_first_block",
                                 ("a[(o * n + k) * m:(o * n + k + 1) * m]", "a[k * m:(k + 1) * m]"))


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


def matmul_by_einsum(a, a_shape, a_strides, b, b_shape, b_strides):
    """Right values, no copy, but numpy's einsum loops instead of gemm: several times the time."""
    return np.einsum("...nk,...km->...nm", _view(a, a_shape, a_strides), _view(b, b_shape, b_strides))


def matmul_by_operator(a, a_shape, a_strides, b, b_shape, b_strides):
    """Correct, written another way: as_strided by its own name, the `@` operator."""
    item = a.itemsize
    return (as_strided(a, tuple(a_shape), tuple(int(s) * item for s in a_strides))
            @ as_strided(b, tuple(b_shape), tuple(int(s) * item for s in b_strides)))


@pytest.mark.parametrize("answer", [blas_matmul, matmul_by_operator])
def test_blas_matmul_sees_the_product_reach_gemm(answer, capsys):
    check.blas_matmul(answer)
    assert "through np.matmul" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, hint", [
    (matmul_copying, "copy of an operand"),
    (matmul_ignoring_strides, "as if they were contiguous"),
    (matmul_in_float64, "came back as float64"),
    (matmul_in_numba, "compiled with Numba"),
    (matmul_by_einsum, "never reached numpy's matmul"),
])
def test_blas_matmul_rejects(wrong, hint):
    expect_failure(check.blas_matmul, wrong, match=hint)


def test_an_edit_the_reference_no_longer_matches_fails_loudly():
    """A wrong implementation written as an edit stops the tests when the reference changes under it."""
    with pytest.raises(AssertionError, match="the reference changed"):
        edited(softplus, "softplus_gone", ("np.log1p(np.exp(x[i]))", "0.0"))


# ---- every exercise: a wrong kernel with the right numbers is rejected for the property it breaks, and
# ---- a right kernel written another way is accepted --------------------------------------------------

def softplus_in_python(x, out):
    """The right numbers, but Python's loop: not the compiled kernel the exercise asks for."""
    for i in range(x.size):
        out[i] = max(x[i], 0.0) + np.log1p(np.exp(-abs(x[i])))
    return out


@njit(parallel=True, cache=True)
def map_serial_range(fn, out, out_shape, out_strides, a, a_strides):
    """parallel=True, but a plain range: the right numbers on one core."""
    size = 1
    for n in out_shape:
        size *= n
    for i in range(size):
        out[position(i, out_shape, out_strides, 0)] = fn(a[position(i, out_shape, a_strides, 0)])


zip_serial_range = edited(strided_zip, "zip_serial_range", ("prange(size)", "range(size)"))
sum_kernel_serial_range = edited(sum_kernel, "sum_kernel_serial_range", ("prange(out.size)", "range(out.size)"))
sum_dim_serial_range = edited(sum_dim, "sum_dim_serial_range", ("sum_kernel(", "sum_kernel_serial_range("),
                              env={"sum_kernel_serial_range": sum_kernel_serial_range})
matmul_serial_range = edited(matmul, "matmul_serial_range", ("prange(n)", "range(n)"))


@njit(parallel=True, cache=True)
def flat_map_parallel(fn, out, a):
    """The right numbers, on every core: the backend already spreads calls over the threads."""
    for i in prange(out.size):
        out[i] = fn(a[i])


@njit(cache=True)
def copy_position_per_element(out, out_shape, out_strides, a, a_strides):
    """The right copy, with two positions computed for every element, as strided_map does."""
    size = 1
    for s in out_shape:
        size *= s
    for i in range(size):
        out[position(i, out_shape, out_strides, 0)] = a[position(i, out_shape, a_strides, 0)]


def sum_columns_numpy(out, a, n, m):
    """The right sums, from numpy in Python: no kernel."""
    out[:] = a.reshape(-1, n, m).sum(axis=1).reshape(-1)


@pytest.mark.parametrize("check_name, args, hint", [
    ("softplus", (softplus_in_python,), "plain Python function"),
    ("position", (position_unsigned,), "signed ordinal"),
    ("strided_map", (map_serial_range,), "none of its loops runs in parallel"),
    ("strided_zip", (zip_serial_range,), "none of its loops runs in parallel"),
    ("sum_dim", (sum_dim_numpy, sum_kernel), "without calling your sum_kernel"),
    ("sum_dim", (sum_dim_serial_range, sum_kernel_serial_range), "none of its loops runs in parallel"),
    ("matmul", (matmul_serial_range,), "none of its loops runs in parallel"),
    ("flat_kernels", (flat_map_parallel, flat_zip), "parallel=True"),
    ("row_layout", (lambda s, o: row_layout(s, o, mistake="full only"),), "reads flat"),
    ("strided_copy", (copy_position_per_element,), "position for every element"),
    ("sum_columns", (sum_columns_numpy,), "plain Python function"),
    ("blas_matmul", (matmul_copying,), "cop"),
])
def test_right_numbers_that_break_the_property_are_rejected(check_name, args, hint):
    expect_failure(getattr(check, check_name), *args, match=hint)


@njit(cache=True)
def softplus_by_branches(x, out):
    for i in range(x.size):
        v = x[i]
        out[i] = v + np.log1p(np.exp(-v)) if v > 0 else np.log1p(np.exp(v))
    return out


@njit(cache=True)
def position_front_to_back(ordinal, shape, strides, offset):
    """Each dim's index from the number of elements one of its steps skips, first dim first."""
    rest = np.int64(ordinal)
    found = offset
    for d in range(len(shape)):
        step = 1
        for e in range(d + 1, len(shape)):
            step *= shape[e]
        if step:
            found += (rest // step) * strides[d]
            rest %= step
    return found


@njit(parallel=True, cache=True)
def map_by_rows(fn, out, out_shape, out_strides, a, a_strides):
    """prange over rows, the elements of a row by their last stride."""
    n = out_shape[len(out_shape) - 1]
    size = 1
    for s in out_shape:
        size *= s
    rows = size // n if n else 0
    for r in prange(rows):
        po = position_front_to_back(r * n, out_shape, out_strides, 0)
        pa = position_front_to_back(r * n, out_shape, a_strides, 0)
        for j in range(n):
            out[po + j * out_strides[len(out_shape) - 1]] = fn(a[pa + j * a_strides[len(out_shape) - 1]])


@njit(cache=True)
def stretched(out_shape, shape, strides):
    """The operand's strides on the output's dims: 0 where it is broadcast."""
    full = np.zeros(len(out_shape), dtype=np.int64)
    extra = len(out_shape) - len(shape)
    for d in range(len(shape)):
        if shape[d] != 1:
            full[extra + d] = strides[d]
    return full


@njit(parallel=True, cache=True)
def zip_by_stretched_strides(fn, out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
    sa, sb = stretched(out_shape, a_shape, a_strides), stretched(out_shape, b_shape, b_strides)
    size = 1
    for s in out_shape:
        size *= s
    for i in prange(size):
        out[position(i, out_shape, out_strides, 0)] = fn(a[position(i, out_shape, sa, 0)],
                                                         b[position(i, out_shape, sb, 0)])


@njit(parallel=True, cache=True)
def sum_kernel_backwards(out, out_shape, a, a_strides, dim, n):
    for i in prange(out.size):
        start = position_front_to_back(i, out_shape, a_strides, 0)
        total = 0.0
        k = n - 1
        while k >= 0:
            total += a[start + k * a_strides[dim]]
            k -= 1
        out[i] = total


def sum_dim_with_zeros(a, shape, strides, dim):
    kept = np.array([1 if d == dim else shape[d] for d in range(len(shape))], dtype=np.int64)
    out = np.zeros(int(np.prod(kept)))
    sum_kernel_backwards(out, kept, a, strides, dim, shape[dim])
    return out.reshape(tuple(kept))


@njit(parallel=True, cache=True)
def matmul_ijk(out, a, b):
    """i-j-k with a local accumulator: slower than i-k-j, and right."""
    for i in prange(a.shape[0]):
        for j in range(b.shape[1]):
            acc = 0.0
            for kk in range(a.shape[1]):
                acc += a[i, kk] * b[kk, j]
            out[i, j] = acc


@njit(cache=True)
def flat_map_while(fn, out, a):
    i = 0
    while i < out.size:
        out[i] = fn(a[i])
        i += 1


@njit(cache=True)
def flat_zip_by_index(fn, out, cols, a, a_row, a_spread, b, b_row, b_spread):
    for i in range(out.size):
        r, j = i // cols, i % cols
        out[i] = fn(a[r * a_row + (j if a_spread else 0)], b[r * b_row + (j if b_spread else 0)])


def row_layout_by_search(shape, out_shape):
    """Tries the four layouts in the order of preference and keeps the first that reads what broadcasting reads."""
    cols = out_shape[-1] if len(out_shape) else 1
    rows = int(np.prod(out_shape)) // cols if cols else 0
    wanted = np.broadcast_to(np.arange(int(np.prod(shape))).reshape(shape), out_shape).reshape(-1)
    for step, spread in ((cols, True), (0, False), (0, True), (1, False)):
        reads = [r * step + (j if spread else 0) for r in range(rows) for j in range(cols)]
        if np.array_equal(np.array(reads, dtype=np.int64).reshape(-1), wanted):
            return step, spread
    return None


@njit(cache=True)
def copy_without_position(out, out_shape, out_strides, a, a_strides):
    """Row starts found by counting the index up like an odometer, no position() at all."""
    nd = len(out_shape)
    n = out_shape[nd - 1]
    size = 1
    for s in out_shape:
        size *= s
    index = np.zeros(nd, dtype=np.int64)
    for r in range(size // n if n else 0):
        po, pa = 0, 0
        for d in range(nd - 1):
            po += index[d] * out_strides[d]
            pa += index[d] * a_strides[d]
        for j in range(n):
            out[po + j * out_strides[nd - 1]] = a[pa + j * a_strides[nd - 1]]
        d = nd - 2
        while d >= 0:
            index[d] += 1
            if index[d] < out_shape[d]:
                break
            index[d] = 0
            d -= 1


@njit(cache=True)
def sum_columns_by_index(out, a, n, m):
    for o in range(out.size // m):
        for j in range(m):
            out[o * m + j] = 0.0
        for k in range(n):
            base = (o * n + k) * m
            for j in range(m):
                out[o * m + j] += a[base + j]


def blas_matmul_by_ndarray(a, a_shape, a_strides, b, b_shape, b_strides):
    def view(storage, shape, strides):
        return np.ndarray(tuple(shape), dtype=storage.dtype, buffer=storage,
                          strides=tuple(int(s) * storage.itemsize for s in strides))
    return view(a, a_shape, a_strides) @ view(b, b_shape, b_strides)


@pytest.mark.parametrize("check_name, args", [
    ("softplus", (softplus_by_branches,)),
    ("position", (position_front_to_back,)),
    ("strided_map", (map_by_rows,)),
    ("strided_zip", (zip_by_stretched_strides,)),
    ("sum_dim", (sum_dim_with_zeros, sum_kernel_backwards)),
    ("matmul", (matmul_ijk,)),
    ("flat_kernels", (flat_map_while, flat_zip_by_index)),
    ("row_layout", (row_layout_by_search,)),
    ("strided_copy", (copy_without_position,)),
    ("sum_columns", (sum_columns_by_index,)),
    ("blas_matmul", (blas_matmul_by_ndarray,)),
])
def test_right_kernels_written_another_way_are_accepted(check_name, args):
    expect_pass(getattr(check, check_name), *args)
