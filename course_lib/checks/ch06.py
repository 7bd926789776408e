"""Checks for chapter 06: Numba kernels on strided views, checked against numpy.

Every strided case is a random view (permuted, sliced with a step and an offset, or
broadcast) of odd sizes. Its storage sits in the middle of a bigger buffer of random
padding, so a kernel that reads past its operand reads wrong numbers instead of crashing,
and a kernel that writes past its output is caught.
"""

import numba
import numpy as np
from numba import njit

from course_lib.checks import CheckFailed, assert_close, exercise, fmt, require, rng  # noqa: F401

PAD = 4096


@njit
def _wiggle(x):
    """The unary function the map check applies: odd, and far from the identity."""
    return x * x * x - 2.0 * x


@njit
def _combine(x, y):
    """The binary function the zip check applies: not symmetric, so swapped operands show."""
    return 2.0 * x - y * y


def _compiled(fn, name, parallel=False):
    require(hasattr(fn, "py_func"), f"`{name}` is a plain Python function, not a compiled kernel.",
            hint=f"decorate it with @njit{'(parallel=True)' if parallel else ''}.")
    if parallel:
        require(fn.targetoptions.get("parallel", False), f"`{name}` is compiled without parallel=True.",
                hint="use @njit(parallel=True) and loop over the independent work with prange.")


class View:
    """A random strided view: storage (inside a padded buffer), shape, strides, offset."""

    def __init__(self, shape, kind):
        shape = tuple(int(n) for n in shape)
        if kind == "permuted":
            order = rng().permutation(len(shape))
            while len(shape) > 1 and (order == np.arange(len(shape))).all():
                order = rng().permutation(len(shape))
            parent = tuple(shape[i] for i in np.argsort(order))
            strides = np.array(_contiguous(parent))[order]
            size, offset = int(np.prod(parent)), 0
        elif kind == "sliced":  # every dim taken with step 2, starting at a random offset (never 0)
            parent = tuple(2 * n + 1 for n in shape)
            strides = 2 * np.array(_contiguous(parent))
            offset = int(rng().integers(1, 3)) * int(_contiguous(parent)[-1])
            size = int(np.prod(parent))
        elif kind == "broadcast":  # at least one dim read with stride 0 (every index, one element)
            stretched = rng().random(len(shape)) < 0.5
            stretched[int(rng().integers(0, len(shape)))] = True
            parent = tuple(1 if b else n for n, b in zip(shape, stretched))
            strides = np.where(stretched, 0, np.array(_contiguous(parent)))
            size, offset = int(np.prod(parent)), 0
        else:
            strides, size, offset = np.array(_contiguous(shape)), int(np.prod(shape)), 0
        self.buffer = rng().uniform(-2, 2, size=size + 2 * PAD)
        self.shape, self.strides, self.offset, self.kind = shape, strides.astype(np.int64), offset, kind

    @property
    def storage(self):
        """The operand as the kernel sees it: a flat array whose element 0 is the view's offset."""
        return self.buffer[PAD + self.offset:len(self.buffer) - PAD]

    def numpy(self):
        item = self.buffer.itemsize
        return np.lib.stride_tricks.as_strided(self.storage, self.shape, tuple(int(s) * item for s in self.strides))

    def as_if_contiguous(self):
        """The first elements of storage read as a contiguous array: what ignoring the strides reads."""
        size = int(np.prod(self.shape))
        return self.buffer[PAD + self.offset:PAD + self.offset + size].reshape(self.shape)

    def padding_intact(self, before):
        return (np.array_equal(self.buffer[:PAD + self.offset], before[:PAD + self.offset])
                and np.array_equal(self.buffer[-PAD:], before[-PAD:]))


def _contiguous(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _column_major(v):
    """The positions a helper gets when it peels the FIRST dim off the ordinal first."""
    index = np.unravel_index(np.arange(int(np.prod(v.shape))), v.shape, order="F")
    return sum(i * int(s) for i, s in zip(index, v.strides)) + v.offset


def _ints(values):
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _odd_shape(ndim):
    return tuple(int(n) for n in rng().choice([1, 3, 5, 7, 9, 11, 13], size=ndim)) if ndim else ()


# ---- 1. an njit elementwise kernel ----------------------------------------------------------

# Fixed inputs drawn on every run, one group per branch a softplus can take: far beyond exp's
# overflow (x > 709), large enough that a cut-off "return x" is still wrong (20 < x < 37), near 0,
# moderately negative (where log(1 + tiny) rounds tiny away) and far negative (a subnormal answer).
SOFTPLUS_FIXED = np.array([710.0, 750.0, 1e4, 36.5, 30.0, 25.0, 20.5, 3.25, 1e-9, -1e-9, -3.25, -20.5,
                           -30.0, -45.0, -100.0, -300.0, -700.0, -744.0, -750.0, -1e4])


@exercise
def softplus(your_softplus):
    """softplus(x, out): out[i] = log(1 + exp(x[i])), stable for large |x|, compiled with @njit."""
    _compiled(your_softplus, "softplus")
    x = np.concatenate([SOFTPLUS_FIXED, rng().uniform(-5, 5, size=997), rng().uniform(-800, 800, size=6)])
    x = x[rng().permutation(x.size)]
    out = rng().uniform(-1, 1, size=x.size)
    result = your_softplus(x, out)
    require(result is None or result is out, "softplus should write into `out` (and may return it).",
            hint="assign out[i] = ... in the loop instead of building a new array.")
    with np.errstate(over="ignore"):
        naive = np.log(1 + np.exp(x))
        patched = np.where(x > 709, x, np.log(1 + np.exp(np.minimum(x, 709))))
        cut_off = np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
    assert_close(out, np.logaddexp(0, x), what="out", rtol=1e-12, atol=1e-300, inputs={"x": x},
                 mistakes={"log(1 + exp(x)) overflows for x above about 709: write it as "
                           "max(x, 0) + log1p(exp(-|x|))": naive,
                           "below about -37 you return 0, where softplus is exp(x), tiny but not 0: "
                           "log(1 + y) loses a tiny y (1 + y rounds to 1). Use log1p(y), as in "
                           "max(x, 0) + log1p(exp(-|x|))": patched,
                           "returning x for x > 20 is off by log1p(exp(-x)), which float64 still sees up to "
                           "x of about 37: use max(x, 0) + log1p(exp(-|x|)) for every x": cut_off,
                           "you dropped the max(x, 0) term: softplus(x) = max(x, 0) + log1p(exp(-|x|))":
                           np.log1p(np.exp(-np.abs(x)))})
    return (f"{x.size:,} values: {SOFTPLUS_FIXED.size} fixed ones in every branch (up to 1e4 and down to "
            f"-1e4) and random ones")


# ---- 2. the strided index helper ------------------------------------------------------------

@exercise
def position(your_position):
    """position(ordinal, shape, strides, offset) -> where that row-major ordinal lives in storage."""
    _compiled(your_position, "position")
    n = 0
    for kind, ndim in [("contiguous", 2), ("permuted", 3), ("sliced", 3), ("permuted", 4), ("sliced", 1)]:
        v = View(_odd_shape(ndim), kind)
        size = int(np.prod(v.shape))
        expected = np.lib.stride_tricks.as_strided(np.arange(len(v.buffer)), v.shape,
                                                   tuple(int(s) * 8 for s in v.strides)).ravel() + v.offset
        shape, strides = _ints(v.shape), _ints(v.strides)
        yours = np.array([your_position(i, shape, strides, v.offset) for i in range(size)])
        inputs = {"shape": v.shape, "strides": tuple(v.strides), "offset": v.offset}
        assert_close(yours, expected, what=f"positions of a {kind} view", atol=0, rtol=0, inputs=inputs,
                     mistakes={"you ignored the strides: those are the positions of a contiguous array":
                               np.arange(size) + v.offset,
                               "you forgot the offset": expected - v.offset,
                               "the last dim should move fastest: peel dims off the ordinal from the last one":
                               _column_major(v)})
        n += 1
    p = your_position(np.uint64(size - 1), shape, strides, v.offset)
    require(isinstance(p, (int, np.integer)),
            f"called with an unsigned ordinal, as a prange loop index is (np.uint64), position returned "
            f"{fmt(p)} of type {type(p).__name__}, not an integer, so it cannot index an array.",
            hint="Numba types uint64 mixed with int64 as float64: start with ordinal = np.int64(ordinal).")
    return f"every element of {n} random views (contiguous, permuted, sliced), and an unsigned ordinal"


# ---- 3. the strided map ---------------------------------------------------------------------

def _run_map(strided_map, a, out):
    before = out.buffer.copy()
    strided_map(_wiggle, out.storage, _ints(out.shape), out.strides, a.storage, a.strides)
    require(out.padding_intact(before), f"your map wrote outside its output view (a {out.kind} view "
            f"of shape {out.shape}).", hint="write only to position(i, out_shape, out_strides, 0).")


@exercise
def strided_map(your_strided_map):
    """strided_map(fn, out, out_shape, out_strides, a, a_strides): out[i] = fn(a[i]) on strided views."""
    _compiled(your_strided_map, "strided_map", parallel=True)
    cases = [("contiguous", "contiguous", 2), ("contiguous", "permuted", 3), ("sliced", "permuted", 3),
             ("permuted", "sliced", 4)]
    for out_kind, a_kind, ndim in cases:
        shape = _odd_shape(ndim)
        a, out = View(shape, a_kind), View(shape, out_kind)
        _run_map(your_strided_map, a, out)
        x = a.numpy()
        assert_close(out.numpy(), x**3 - 2 * x, what=f"out (a {out_kind} view) from a {a_kind} input",
                     rtol=1e-12, atol=1e-12, inputs={"shape": shape, "a_strides": tuple(a.strides),
                                                     "out_strides": tuple(out.strides)},
                     mistakes={"you read a as if it were contiguous: use a_strides to find a[i]":
                               (lambda f: f**3 - 2 * f)(a.storage[:x.size].reshape(shape))},
                     hint="find both positions from the same ordinal i: position(i, out_shape, out_strides, 0) "
                          "and position(i, out_shape, a_strides, 0).")
    return f"{len(cases)} random views: contiguous, permuted and sliced inputs and outputs"


# ---- 4. zip with broadcasting ---------------------------------------------------------------

def _broadcast_case(kind_a, kind_b, ndim):
    """Operand shapes that broadcast to a random out shape: some dims 1, some leading dims missing."""
    out_shape = tuple(n if n > 1 else 3 for n in _odd_shape(ndim))
    shape_a = [1 if rng().random() < 0.4 else n for n in out_shape]
    shape_a[0], shape_a[-1] = out_shape[0], 1  # always one broadcast dim after a real one: ignoring
    shape_a = tuple(shape_a)                   # broadcasting then reads the wrong elements
    shape_b = tuple(1 if rng().random() < 0.4 else n for n in out_shape)[int(rng().integers(0, ndim)):]
    return out_shape, View(shape_a, kind_a), View(shape_b, kind_b)


# Drawn on every run: operands of LOWER rank than the output, with sizes that also fit when aligned
# on the left, so a kernel that pairs operand dim d with output dim d reads the wrong elements
# instead of failing: (7,) against (7, 7) is the classic, and a (5, 1) inside (3, 5, 7).
ZIP_FIXED = [("fixed", "permuted", "sliced", ((7, 7), (7, 7), (7,))),
             ("fixed", "contiguous", "permuted", ((3, 5, 7), (5, 1), (3, 1, 7))),
             ("fixed", "sliced", "contiguous", ((5, 3, 5), (3, 1), (5,)))]


@exercise
def strided_zip(your_strided_zip):
    """strided_zip(fn, out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides)."""
    _compiled(your_strided_zip, "strided_zip", parallel=True)
    cases = [("same", "permuted", "sliced", 3), ("broadcast", "contiguous", "contiguous", 2),
             ("broadcast", "permuted", "sliced", 3), ("broadcast", "sliced", "permuted", 4)]
    cases += ZIP_FIXED
    for what, kind_a, kind_b, ndim in cases:
        if what == "same":
            out_shape = _odd_shape(ndim)
            a, b = View(out_shape, kind_a), View(out_shape, kind_b)
        elif what == "fixed":
            out_shape, shape_a, shape_b = ndim
            a, b = View(shape_a, kind_a), View(shape_b, kind_b)
        else:
            out_shape, a, b = _broadcast_case(kind_a, kind_b, ndim)
        out = View(out_shape, "contiguous")
        before = out.buffer.copy()
        your_strided_zip(_combine, out.storage, _ints(out_shape), out.strides, a.storage, _ints(a.shape), a.strides,
                    b.storage, _ints(b.shape), b.strides)
        require(out.padding_intact(before), "your zip wrote outside its output.",
                hint="loop over the output's ordinals only: range(size of out_shape).")
        x, y = np.broadcast_to(a.numpy(), out_shape), np.broadcast_to(b.numpy(), out_shape)
        assert_close(out.numpy(), 2 * x - y * y, what=f"out for a of shape {a.shape} and b of shape {b.shape}",
                     rtol=1e-12, atol=1e-12,
                     inputs={"out_shape": out_shape, "a_strides": tuple(a.strides), "b_strides": tuple(b.strides)},
                     mistakes={"a and b are swapped: out[i] = fn(a[i], b[i])": 2 * y - x * x},
                     hint=None if what == "same" else
                     "broadcasting: align the shapes on the right; a dim of size 1, or a dim a shape lacks, "
                     "always reads index 0 (it adds nothing to the position).")
    return (f"{len(cases) - len(ZIP_FIXED)} random cases (strided views of one shape, broadcast shapes) "
            f"and {len(ZIP_FIXED)} fixed ones where operands of lower rank must align on the right")


# ---- 5. reduce along a dimension ------------------------------------------------------------

_RACE = ("a race: several threads read-modify-write the same output element and lose updates. Make "
         "prange run over the OUTPUT elements, each with its own local accumulator, and keep the loop "
         "over the reduced dim serial.")


@exercise
def sum_dim(your_sum_dim, your_sum_kernel):
    """sum_dim(a, shape, strides, dim) -> a fresh array of shape with shape[dim] = 1 (keepdim),
    computed by the parallel kernel sum_kernel(out, out_shape, a, a_strides, dim, n)."""
    _compiled(your_sum_kernel, "sum_kernel", parallel=True)
    cases = [("permuted", 3, 1), ("sliced", 3, 0), ("contiguous", 2, 1), ("permuted", 4, 3), ("sliced", 1, 0),
             ("broadcast", 3, 1), ("broadcast", 2, 0)]
    for kind, ndim, dim in cases:
        v = View(_odd_shape(ndim), kind)
        x = v.numpy()
        expected = x.sum(axis=dim, keepdims=True)
        inputs = {"shape": v.shape, "strides": tuple(v.strides), "dim": dim}
        yours = your_sum_dim(v.storage, _ints(v.shape), v.strides, dim)
        require(isinstance(yours, np.ndarray), f"sum_dim should return a numpy array, got {type(yours).__name__}.")
        again = your_sum_dim(v.storage, _ints(v.shape), v.strides, dim)
        require(np.shape(again) == yours.shape and np.array_equal(again, yours),
                f"two runs on the same {kind} view of shape {v.shape} (dim {dim}) gave different sums.", hint=_RACE)
        assert_close(yours, expected, what=f"the sum over dim {dim} of a {kind} view",
                     rtol=1e-10, atol=1e-12, inputs=inputs,
                     mistakes={f"the output keeps dim {dim} with size 1 (keepdim): reshape to "
                               f"shape with shape[dim] = 1": x.sum(axis=dim),
                               "you ignored the strides: that is the sum of a contiguous array":
                               v.as_if_contiguous().sum(axis=dim, keepdims=True)},
                     hint="each output sums one line of a: it starts at position(i, out_shape, strides) and "
                          "steps by strides[dim]. If prange runs over the reduced dim, this may be " + _RACE)
        # The kernel on its own, so the sums must come from it (not from numpy in sum_dim).
        out_shape = _ints(v.shape)
        out_shape[dim] = 1
        out = np.zeros(expected.size)
        your_sum_kernel(out, out_shape, v.storage, v.strides, dim, v.shape[dim])
        assert_close(out, expected.ravel(), what=f"sum_kernel's flat out for the sum over dim {dim} of a {kind} view",
                     rtol=1e-10, atol=1e-12, inputs=inputs,
                     hint="sum_kernel must compute the sums itself: out[i] is the sum of the line of a that "
                          "output i reads, for every i of the flat out. If it does, this may be " + _RACE)
    # A race shows up when many threads add into few outputs: one output, a long dim, 3 runs,
    # on every thread (the fast backend may have left this thread's count at 1 for small work).
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    v = View((2, 300_001), "contiguous")
    expected = v.numpy().sum(axis=1, keepdims=True)
    for run in range(3):
        yours = your_sum_dim(v.storage, _ints(v.shape), v.strides, 1)
        assert_close(yours, expected, what=f"run {run + 1} of 3 of a sum over a long dim (shape (2, 300001))",
                     rtol=1e-9, atol=1e-9,
                     hint=_RACE)
    return f"{len(cases)} random strided views (2 with broadcast dims), and a long sum run 3 times to catch races"


# ---- 6. the parallel matmul -----------------------------------------------------------------

@exercise
def matmul(your_matmul):
    """matmul(out, a, b) writes a @ b into out (whatever out held before), for 2-D arrays."""
    _compiled(your_matmul, "matmul", parallel=True)
    # A race (prange over the reduction dim k: threads add into the same out[i, j]) loses updates
    # only when two threads overlap, so every product runs 3 times, on every thread, and one case
    # has a long k and a short row, where the threads collide on almost every update.
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    repeats = 3
    for n, k, m in [(37, 53, 29), (1, 17, 5), (64, 31, 65), (3, 20_001, 5)]:
        a = rng().uniform(-1, 1, size=(n, k))
        b = rng().uniform(-1, 1, size=(m, k)).T  # a transposed (strided) operand
        for run in range(repeats):
            out = rng().uniform(-1, 1, size=(n, m))
            garbage = out.copy()
            your_matmul(out, a, b)
            assert_close(out, a @ b, what=f"out for a {n}x{k} times a {k}x{m} (run {run + 1} of {repeats})",
                         rtol=1e-10, atol=1e-10, inputs={"a": a, "b": b},
                         mistakes={"out was not zero when you started accumulating: set out to 0 first":
                                   garbage + a @ b},
                         hint=("if the loops are right, look at which one prange splits: over k it is "
                               if run == 0 else "this product was right on an earlier run: ")
                         + _RACE.replace("reduced dim", "k dim"))
    return f"4 random odd sizes, one with a long k, one operand transposed, each run {repeats} times"
