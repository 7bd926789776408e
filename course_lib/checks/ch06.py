"""Checks for chapter 06: Numba kernels on strided views, checked against numpy.

Every strided case is a random view (permuted, sliced with a step and an offset, or
broadcast) of odd sizes. Its storage sits in the middle of a bigger buffer of random
padding, so a kernel that reads past its operand reads wrong numbers instead of crashing,
and a kernel that writes past its output is caught.
"""

import types

import numba
import numpy as np
from numba import njit

from course_lib.checks import CheckFailed, assert_close, exercise, fmt, require, rng  # noqa: F401
from course_lib.checks.plain_python import AsPython

PAD = 4096


@njit
def _wiggle(x):
    """The unary function the map check applies: odd, and far from the identity."""
    return x * x * x - 2.0 * x


@njit
def _combine(x, y):
    """The binary function the zip check applies: not symmetric, so swapped operands show."""
    return 2.0 * x - y * y


def _compiled(fn, name, parallel=False, serial=False):
    require(hasattr(fn, "py_func"), f"`{name}` is a plain Python function, not a compiled kernel.",
            hint=f"decorate it with @njit{'(parallel=True)' if parallel else ''}.")
    if parallel:
        require(fn.targetoptions.get("parallel", False), f"`{name}` is compiled without parallel=True.",
                hint="use @njit(parallel=True) and loop over the independent work with prange.")
    if serial:
        require(not fn.targetoptions.get("parallel", False),
                f"`{name}` is compiled with parallel=True; this kernel runs on one core, a plain @njit: the "
                "backend already spreads its calls over the threads.")


def _diagnostics(fn, signature):
    """Numba's parfor diagnostics of `fn` compiled for `signature`. A version loaded from Numba's disk cache
    keeps none, so then a fresh copy (never cached) is compiled for the same types."""
    try:
        metadata = fn.get_metadata(signature) or {}
    except (KeyError, TypeError, AttributeError):
        metadata = {}
    if metadata.get("parfor_diagnostics") is None:
        options = {k: v for k, v in fn.targetoptions.items() if k not in ("cache", "nopython")}
        fresh = numba.njit(**options)(fn.py_func)
        fresh.compile(signature)
        metadata = fresh.get_metadata(fresh.signatures[0]) or {}
    return metadata.get("parfor_diagnostics")


def _prange_loops(fn):
    """How many prange loops Numba turned into parallel loops in the versions of `fn` compiled so far
    (its own diagnostics, whatever the number of cores)."""
    found = 0
    for signature in fn.signatures:
        for parfor in getattr(_diagnostics(fn, signature), "initial_parfors", None) or []:
            found += any(pattern[0] == "prange" for pattern in parfor.patterns if isinstance(pattern, tuple))
    return found


def _runs_in_parallel(fn, name):
    """The property of a parallel kernel, checked on the compiled code rather than on a clock: Numba made
    at least one of its loops a parallel loop."""
    require(_prange_loops(fn) > 0,
            f"`{name}` computes the right numbers, but none of its loops runs in parallel: it is compiled with "
            "parallel=True, yet Numba found no prange loop it could run in parallel (a prange it cannot split "
            "runs as a plain loop, with a NumbaPerformanceWarning that says why).",
            hint="a loop runs in parallel only when it is a prange, and the kernel's independent work (one "
                 "output element, or one row) is what prange should split.")


def _with_globals(fn, **replaced):
    """A compiled copy of the learner's kernel `fn` in which the global names given are bound to other
    objects, the check's instruments; the learner's own kernel and module are left as they were."""
    py = fn.py_func
    scope = dict(py.__globals__, **replaced)
    copy = types.FunctionType(py.__code__, scope, py.__name__, py.__defaults__, py.__closure__)
    options = {k: v for k, v in fn.targetoptions.items() if k not in ("cache", "nopython")}  # not the cached build
    return numba.njit(**options)(copy)


class _Watched(np.ndarray):
    """An array that tells a _Probe which of its elements are read and written, and by which prange
    iteration: the check runs the learner's kernel as plain Python (its py_func) on such arrays."""

    probe = None

    def __array_finalize__(self, obj):
        self.where = getattr(obj, "where", None)      # each element's number in the watched array

    def __getitem__(self, key):
        got = super().__getitem__(key)
        where = self.where[key]
        if isinstance(got, _Watched):
            got.where = where
        elif self.probe is not None:
            self.probe.read(where)
        return got

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if self.probe is not None:
            self.probe.wrote(np.ravel(self.where[key]))


class _Probe:
    """Runs a kernel's Python source, its prange loops one iteration after another, and records which
    iteration wrote each element of the watched arrays (a race: two iterations write one element) and
    the order of the single elements read. Independent of the machine and of the number of threads."""

    def __init__(self, kernel):
        self.kernel, self.task, self.depth = kernel, None, 0
        self.writer, self.clash, self.reads = {}, None, []

    def watch(self, array):
        watched = np.array(array).view(_Watched)
        watched.where = np.arange(watched.size).reshape(watched.shape)
        watched.probe = self
        return watched

    def prange(self, *bounds):
        self.depth += 1
        try:
            for t in range(*bounds):
                if self.depth == 1:
                    self.task = ("loop", t)
                yield t
        finally:
            self.depth -= 1
            if self.depth == 0:
                self.task, self.writer = None, {}    # the next prange loop starts afresh

    def read(self, where):
        self.reads.append(int(where))

    def wrote(self, elements):
        if self.task is None:
            return
        for e in elements.tolist():
            other = self.writer.setdefault(e, self.task)
            if other != self.task and self.clash is None:
                self.clash = (e, other[1], self.task[1])

    def run(self, *args):
        """Runs the kernel; False when its source cannot run as plain Python (then the probe says nothing)."""
        copy = AsPython({numba.prange: self.prange}).function(self.kernel, top=True)
        try:
            with np.errstate(all="ignore"):
                copy(*args)
        except Exception:
            return False
        return True


def _require_no_race(kernel, name, args, watched, what):
    """Runs `kernel` on small inputs as a _Probe: no two iterations of a prange loop may write one element
    of argument `watched` (what it is called in the message)."""
    probe = _Probe(kernel)
    args = list(args)
    args[watched] = probe.watch(args[watched])
    if probe.run(*args) and probe.clash:
        e, first, second = probe.clash
        raise CheckFailed(f"your {name} has a race: iterations {first} and {second} of its prange loop both "
                          f"wrote element {e} of {what}. The values can come out right when the threads happen not to "
                          f"overlap (it depends on the machine and its load), but they may not.\n  hint: " + _RACE)


@njit
def _row_start_position(ordinal, shape, strides, offset):
    """position() that answers right only at the start of a row (an ordinal that is a multiple of the last
    dim): anywhere else it gives the row's start. A copy that finds one position per row cannot tell."""
    n = shape[len(shape) - 1] if len(shape) else 1
    start = np.int64(ordinal) - (np.int64(ordinal) % n if n else 0)
    found = offset
    for d in range(len(shape)):
        after = 1                                   # the elements one step of dim d skips
        for e in range(d + 1, len(shape)):
            after *= shape[e]
        found += ((start // after) % shape[d]) * strides[d] if after else 0
    return found


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
                 mistakes={"log(1 + exp(x)) overflows for x above about 709: the stable form never hands exp "
                           "a large positive number": naive,
                           "below about -37 you return 0, where softplus is exp(x), tiny but not 0: "
                           "log(1 + y) loses a tiny y (1 + y rounds to 1), which log1p keeps": patched,
                           "returning x for x > 20 is off by log1p(exp(-x)), which float64 still sees up to "
                           "x of about 37: the stable form is exact for every x, with no cut-off": cut_off,
                           "you dropped the max(x, 0) term of the stable form: it carries the size of a large x":
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
                               "the last dim should move fastest: row-major order":
                               _column_major(v)})
        n += 1
    p = your_position(np.uint64(size - 1), shape, strides, v.offset)
    require(isinstance(p, (int, np.integer)),
            f"called with an unsigned ordinal, as a prange loop index is (np.uint64), position returned "
            f"{fmt(p)} of type {type(p).__name__}, not an integer, so it cannot index an array.",
            hint="Numba types uint64 mixed with int64 as float64, which is why the exercise starts from a signed ordinal.")
    return f"every element of {n} random views (contiguous, permuted, sliced), and an unsigned ordinal"


# ---- 3. the strided map ---------------------------------------------------------------------

def _run_map(strided_map, a, out):
    before = out.buffer.copy()
    strided_map(_wiggle, out.storage, _ints(out.shape), out.strides, a.storage, a.strides)
    require(out.padding_intact(before), f"your map wrote outside its output view (a {out.kind} view "
            f"of shape {out.shape}).",
            hint="every write must land on an element of the output view, found through its own strides.")


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
                     mistakes={"you read a as if it were contiguous: a has strides of its own":
                               (lambda f: f**3 - 2 * f)(a.storage[:x.size].reshape(shape))},
                     hint="the same ordinal names the same element in both views, each found through that view's "
                          "own strides.")
    _runs_in_parallel(your_strided_map, "strided_map")
    return f"{len(cases)} random views: contiguous, permuted and sliced inputs and outputs, in a prange loop"


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
                hint="the loop runs over the output's elements, and no further.")
        x, y = np.broadcast_to(a.numpy(), out_shape), np.broadcast_to(b.numpy(), out_shape)
        assert_close(out.numpy(), 2 * x - y * y, what=f"out for a of shape {a.shape} and b of shape {b.shape}",
                     rtol=1e-12, atol=1e-12,
                     inputs={"out_shape": out_shape, "a_strides": tuple(a.strides), "b_strides": tuple(b.strides)},
                     mistakes={"a and b are swapped: out[i] = fn(a[i], b[i])": 2 * y - x * x},
                     hint=None if what == "same" else
                     "broadcasting: align the shapes on the right; a dim of size 1, or a dim a shape lacks, "
                     "always reads index 0 (it adds nothing to the position).")
    _runs_in_parallel(your_strided_zip, "strided_zip")
    return (f"{len(cases) - len(ZIP_FIXED)} random cases (strided views of one shape, broadcast shapes) "
            f"and {len(ZIP_FIXED)} fixed ones where operands of lower rank must align on the right, in a prange loop")


# ---- 5. reduce along a dimension ------------------------------------------------------------

_RACE = ("a race: several threads read-modify-write the same output element and lose updates. Each "
         "output element needs a thread of its own and an accumulator of its own; the loop over the "
         "reduced dim cannot be split among threads.")


def _calling_the_kernel(your_sum_dim, your_sum_kernel):
    """Your sum_dim, run with your kernel's calls counted (the name your code calls it by points, for the
    length of each call, at a counter that calls it): its sums must come from the kernel."""
    calls = []

    def counted(*args):
        calls.append(1)
        return your_sum_kernel(*args)
    py = getattr(your_sum_dim, "py_func", your_sum_dim)
    scope = getattr(py, "__globals__", {})
    names = [name for name, value in scope.items() if value is your_sum_kernel]
    cells = [c for c in getattr(py, "__closure__", None) or () if c.cell_contents is your_sum_kernel]

    def run(*args):
        before = len(calls)
        for name in names:
            scope[name] = counted
        for cell in cells:                          # a kernel your sum_dim reaches through a closure
            cell.cell_contents = counted
        try:
            result = your_sum_dim(*args)
        finally:
            for name in names:
                scope[name] = your_sum_kernel
            for cell in cells:
                cell.cell_contents = your_sum_kernel
        require(len(calls) > before,
                "your sum_dim returned its sums without calling your sum_kernel: the sums must come from the "
                "parallel kernel, which is what this exercise writes.",
                hint="sum_dim only prepares the output, runs the kernel on it and reshapes the result.")
        return result
    return run


@exercise
def sum_dim(your_sum_dim, your_sum_kernel):
    """sum_dim(a, shape, strides, dim) -> a fresh array of shape with shape[dim] = 1 (keepdim),
    computed by the parallel kernel sum_kernel(out, out_shape, a, a_strides, dim, n)."""
    _compiled(your_sum_kernel, "sum_kernel", parallel=True)
    your_sum_dim = _calling_the_kernel(your_sum_dim, your_sum_kernel)
    v = View((5, 7), "contiguous")
    _require_no_race(your_sum_kernel, "sum_kernel", (np.empty(7), _ints((1, 7)), v.storage, v.strides, 0, 5), 0,
                     "out (the sums over dim 0 of a (5, 7) array)")
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
                     hint="each output sums one line of a, along dim, read through a's strides. If prange runs "
                          "over the reduced dim, this may be " + _RACE)
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
    _runs_in_parallel(your_sum_kernel, "sum_kernel")
    return (f"{len(cases)} random strided views (2 with broadcast dims), and a long sum run 3 times, by your kernel "
            "in a prange loop whose iterations write separate outputs")


# ---- 6. the parallel matmul -----------------------------------------------------------------

@exercise
def matmul(your_matmul):
    """matmul(out, a, b) writes a @ b into out (whatever out held before), for 2-D arrays."""
    _compiled(your_matmul, "matmul", parallel=True)
    a, b = rng().uniform(-1, 1, size=(5, 6)), rng().uniform(-1, 1, size=(6, 4))
    _require_no_race(your_matmul, "matmul", (np.empty((5, 4)), a, b), 0, "out (5x6 times 6x4)")
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
    _runs_in_parallel(your_matmul, "matmul")
    return (f"4 random odd sizes, one with a long k, one operand transposed, each run {repeats} times, in a prange loop "
            "whose iterations write separate outputs")


# ---- 7. flat kernels for contiguous operands ------------------------------------------------------

# How an operand is read by a contiguous output seen as rows of `cols`: row r starts at r * row_step,
# and the operand moves along the row (spread) or repeats that one number.
LAYOUTS = {"the output's shape": "full", "a row, repeated on every row": "row",
           "one number per row": "column", "one number": "one"}


def _layout(kind, rows, cols):
    """(row_step, spread, number of elements the operand holds) for a kind of LAYOUTS."""
    return {"full": (cols, True, rows * cols), "row": (0, True, cols), "column": (1, False, rows),
            "one": (0, False, 1)}[kind]


def _read(x, row_step, spread, rows, cols):
    """The (rows, cols) grid an operand stored in x gives under (row_step, spread)."""
    r, j = np.arange(rows)[:, None], np.arange(cols)[None, :]
    return x[r * row_step + (j if spread else 0 * j)]


def _padded(size):
    """A random operand of `size` elements inside random padding: reading past it reads wrong numbers."""
    buffer = rng().uniform(-2, 2, size=size + 2 * PAD)
    return buffer, buffer[PAD:PAD + size]


@exercise
def flat_kernels(your_flat_map, your_flat_zip):
    """flat_map(fn, out, a): out[i] = fn(a[i]); flat_zip(fn, out, cols, a, a_row, a_spread, b, b_row, b_spread)."""
    _compiled(your_flat_map, "flat_map", serial=True)
    _compiled(your_flat_zip, "flat_zip", serial=True)
    for size in (1, int(rng().integers(2, 40)), 4097 + int(rng().integers(0, 50))):
        _, a = _padded(size)
        out_buffer, out = _padded(size)
        before = out_buffer.copy()
        your_flat_map(_wiggle, out, a)
        require(np.array_equal(out_buffer[:PAD], before[:PAD]) and np.array_equal(out_buffer[-PAD:], before[-PAD:]),
                f"your flat_map wrote outside its output (of {size} elements).",
                hint="the loop runs over out's elements, and no further.")
        assert_close(out, a**3 - 2 * a, what=f"flat_map's out ({size} elements)", rtol=1e-12, atol=1e-12)
    kinds = list(LAYOUTS.values())
    pairs = [("full", "full"), ("full", "row"), ("column", "full"), ("one", "row"), ("row", "column"),
             ("full", "one")] + [(kinds[int(i)], kinds[int(j)]) for i, j in rng().integers(0, 4, size=(2, 2))]
    for a_kind, b_kind in pairs:
        rows, cols = int(rng().integers(1, 9)), int(rng().integers(1, 12))
        a_row, a_spread, a_size = _layout(a_kind, rows, cols)
        b_row, b_spread, b_size = _layout(b_kind, rows, cols)
        (_, a), (_, b) = _padded(a_size), _padded(b_size)
        out_buffer, out = _padded(rows * cols)
        before = out_buffer.copy()
        your_flat_zip(_combine, out, cols, a, a_row, a_spread, b, b_row, b_spread)
        require(np.array_equal(out_buffer[:PAD], before[:PAD]) and np.array_equal(out_buffer[-PAD:], before[-PAD:]),
                f"your flat_zip wrote outside its output ({rows} rows of {cols}).",
                hint="the output has out.size // cols rows of cols numbers, and no more.")
        x, y = _read(a, a_row, a_spread, rows, cols), _read(b, b_row, b_spread, rows, cols)
        name = {v: k for k, v in LAYOUTS.items()}
        assert_close(out.reshape(rows, cols), 2 * x - y * y,
                     what=f"flat_zip's out ({rows} rows of {cols}; a: {name[a_kind]}, b: {name[b_kind]})",
                     rtol=1e-12, atol=1e-12,
                     inputs={"a_row": a_row, "a_spread": a_spread, "b_row": b_row, "b_spread": b_spread},
                     mistakes={"a and b are swapped: out = fn(a's number, b's number)": 2 * y - x * x},
                     hint="an operand's part of row r starts r * row_step in (only an operand of the output's "
                          "shape has rows cols long), and inside the row only a spread operand moves.")
    return f"flat_map on 3 sizes; flat_zip on {len(pairs)} pairs of the four cases (a row, a column, one number, full)"


# ---- 8. which operands read flat ------------------------------------------------------------------

# Drawn on every run: each case of the rule, with the classic traps (a lower rank aligned on the right,
# a size-1 output dim, an operand with one number per row of a smaller grid, which no single step reads).
LAYOUT_FIXED = [((4, 3, 5), (4, 3, 5)), ((), ()), ((), (3, 4)), ((1,), (6,)), ((1, 1), (3, 1)),
                ((5,), (4, 3, 5)), ((1, 5), (3, 5)), ((7,), (7, 7)), ((3, 1), (3, 5)), ((2, 3, 1), (2, 3, 5)),
                ((3, 1), (3, 1)), ((3, 1), (2, 3, 5)), ((3, 5), (2, 3, 5)), ((2, 1, 5), (2, 3, 5)),
                ((1, 3, 1), (2, 3, 1)), ((4, 1, 1), (4, 3, 2)), ((2, 4), (1, 2, 4)), ((3, 1), (1, 3, 1))]


def _reads(shape, out_shape):
    """For each element of out_shape (row-major), the flat index of the contiguous operand it reads."""
    index = np.arange(int(np.prod(shape))).reshape(shape) if shape else np.arange(1).reshape(())
    return np.broadcast_to(index, out_shape).reshape(-1)


def _reads_with(layout, out_shape):
    cols = out_shape[-1] if out_shape else 1
    rows = int(np.prod(out_shape)) // cols if cols else 0
    row_step, spread = layout
    r, j = np.arange(rows)[:, None], np.arange(cols)[None, :]
    return (r * row_step + (j if spread else 0 * j)).reshape(-1)


def _best_layout(shape, out_shape):
    """The first of the four cases whose reads are broadcasting's, or None."""
    cols = out_shape[-1] if out_shape else 1
    truth = _reads(shape, out_shape)
    for layout in ((cols, True), (0, False), (0, True), (1, False)):
        if np.array_equal(_reads_with(layout, out_shape), truth):
            return layout
    return None


@exercise
def row_layout(your_row_layout):
    """row_layout(shape, out_shape) -> (row_step, spread) for the flat kernels, or None."""
    cases = list(LAYOUT_FIXED)
    for _ in range(12):
        out_shape = tuple(int(n) for n in rng().integers(2, 6, size=int(rng().integers(1, 4))))
        start = int(rng().integers(0, len(out_shape) + 1))
        shape = tuple(1 if rng().random() < 0.4 else n for n in out_shape[start:])
        cases.append((shape, out_shape))
    names = {True: "spread", False: "not spread"}
    for shape, out_shape in cases:
        expected = _best_layout(shape, out_shape)
        yours = your_row_layout(shape, out_shape)
        inputs = {"shape": shape, "out_shape": out_shape}
        if yours is None:
            if expected is not None:
                raise CheckFailed(
                    f"row_layout{(shape, out_shape)} returned None, but a contiguous operand of shape {shape} under "
                    f"an output {out_shape} reads flat: row_step {expected[0]}, {names[expected[1]]}.\n  hint: pad "
                    f"the shape with 1s on the left to the output's rank before you compare; a size-1 operand is "
                    f"one number.")
            continue
        require(isinstance(yours, (tuple, list)) and len(yours) == 2,
                f"row_layout{(shape, out_shape)} should return (row_step, spread) or None, got {fmt(yours)}.")
        layout = (int(yours[0]), bool(yours[1]))
        if expected is None:
            raise CheckFailed(
                f"row_layout{(shape, out_shape)} returned {layout}, but no (row_step, spread) reads a contiguous "
                f"operand of shape {shape} the way broadcasting to {out_shape} does; return None there.\n  hint: "
                f"an operand whose dims other than the last are neither all 1 nor the output's own has one "
                f"number (or one row) per row of a smaller grid, which repeats: no single step reads it.")
        assert_close(_reads_with(layout, out_shape), _reads(shape, out_shape),
                     what=f"the operand elements your layout {layout} reads for shape {shape} under {out_shape}",
                     atol=0, rtol=0, inputs=inputs,
                     hint=f"the rule's answer is {expected}: cols = out_shape[-1], and shapes align on the right.")
    return f"{len(LAYOUT_FIXED)} fixed pairs of shapes (every case and its traps) and 12 random ones"


# ---- 9. a strided copy, one position per row ------------------------------------------------------

@exercise
def strided_copy(your_strided_copy):
    """strided_copy(out, out_shape, out_strides, a, a_strides): out[i] = a[i], views with their own strides."""
    _compiled(your_strided_copy, "strided_copy")
    cases = [("contiguous", "permuted", 3), ("sliced", "sliced", 2), ("permuted", "broadcast", 3),
             ("sliced", "permuted", 4), ("contiguous", "sliced", 1), ("permuted", "contiguous", 2)]
    for out_kind, a_kind, ndim in cases:
        shape = _odd_shape(ndim)
        a, out = View(shape, a_kind), View(shape, out_kind)
        before = out.buffer.copy()
        your_strided_copy(out.storage, _ints(out.shape), out.strides, a.storage, a.strides)
        require(out.padding_intact(before), f"your copy wrote outside its output view (a {out_kind} view of shape "
                f"{out.shape}).", hint="every write must land on an element of the output view, found through its own strides.")
        assert_close(out.numpy(), a.numpy(), what=f"the copy into a {out_kind} view of a {a_kind} view", atol=0,
                     rtol=0, inputs={"shape": shape, "a_strides": tuple(a.strides), "out_strides": tuple(out.strides)},
                     mistakes={"you read a as if it were contiguous: a has strides of its own": a.as_if_contiguous()},
                     hint="a row's start is a position in each view, through that view's strides; along the row, "
                          "each view moves by its own last stride.")
    for shape in ((3, 0), (0, 4)):                  # nothing to copy, nothing to divide by
        out = View(shape, "contiguous")
        your_strided_copy(out.storage, _ints(shape), out.strides, View(shape, "contiguous").storage, out.strides)
    # The property: a position per row, not per element. Your kernel, recompiled with a position() that
    # is right only at a row's start, must still copy right.
    if "position" in your_strided_copy.py_func.__code__.co_names:
        per_row = _with_globals(your_strided_copy, position=_row_start_position)
        shape = _odd_shape(2) + (int(rng().choice([3, 5, 7, 9])),)   # rows longer than one element
        a, out = View(shape, "permuted"), View(shape, "sliced")
        per_row(out.storage, _ints(shape), out.strides, a.storage, a.strides)
        require(np.array_equal(out.numpy(), a.numpy()),
                "your copy asks position() for elements inside a row: it computes a position for every element, "
                "as strided_map does, where one per row is all the copy needs.",
                hint="inside a row, the next element of each view is that view's last stride further on.")
    return (f"{len(cases)} random pairs of views (permuted, sliced, broadcast), two empty shapes, and one "
            "position per row")


# ---- 10. sums down the columns --------------------------------------------------------------------

@exercise
def sum_columns(your_sum_columns):
    """sum_columns(out, a, n, m): out[o * m + j] = sum over k of a[(o * n + k) * m + j], a contiguous."""
    _compiled(your_sum_columns, "sum_columns")
    cases = [(1, int(rng().integers(2, 30)), int(rng().integers(2, 20))),
             (int(rng().integers(2, 5)), int(rng().integers(1, 9)), int(rng().integers(2, 9))),
             (3, 1, 5), (1, 301, 2), (2, 7, 1029)]
    for outer, n, m in cases:
        buffer, _ = _padded(outer * n * m)
        for dtype in (np.float64, np.float32):
            x = buffer.astype(dtype)[PAD:PAD + outer * n * m]    # padded: reading past a reads wrong numbers
            out = rng().uniform(-1, 1, size=outer * m)
            garbage = out.copy()
            your_sum_columns(out, x, n, m)
            grid = x.astype(np.float64).reshape(outer, n, m)
            assert_close(out, grid.sum(axis=1).reshape(-1),
                         what=f"the column sums of a ({outer}, {n}, {m}) {dtype.__name__} array",
                         rtol=1e-10, atol=1e-10, inputs={"outer": outer, "n": n, "m": m},
                         mistakes={"out was not zero when you started adding: set its slice to 0 first":
                                   garbage + grid.sum(axis=1).reshape(-1),
                                   "those are the sums of the first block only: there are out.size // m blocks":
                                   np.concatenate([grid[0].sum(0)] * outer)},
                         hint="out[o * m + j] adds up a[(o * n + k) * m + j] for k = 0 .. n - 1.")
    _require_rows_walked(your_sum_columns)
    return (f"{len(cases)} shapes (outer, n, m), float64 and float32, out holding garbage at the start; a's numbers "
            "read along its rows")


def _require_rows_walked(kernel):
    """The exercise's point: a is read along its rows, at stride 1, not down its columns. Run as a _Probe, a
    kernel that reads single numbers must read most of them right after their left neighbour."""
    outer, n, m = 2, 5, 7
    probe = _Probe(kernel)
    a = probe.watch(rng().uniform(-1, 1, size=outer * n * m))
    if not probe.run(np.empty(outer * m), a, n, m) or len(probe.reads) < outer * n * m:
        return                                   # whole slices at once: numpy's own walk, along the rows
    steps = np.diff(probe.reads)
    require(np.mean(steps == m) < 0.5,
            f"your sum_columns reads a down its columns: of its {len(steps) + 1} reads of a ({outer}, {n}, {m}) array, "
            f"{np.mean(steps == m):.0%} come {m} numbers (one row) after the one before, "
            f"{np.mean(steps == 1):.0%} right after it. The sums are right, but each read is on another cache line: "
            "this is the walk your sum_kernel already does.",
            hint="the exercise turns the loops around: the innermost loop runs along a row, adding it into the "
                 "block's m accumulators (lesson 06, section 13).")


# ---- 11. products through BLAS --------------------------------------------------------------------

def _traced_peak(fn, *args):
    """(fn's result, the bytes numpy allocated at the peak of the call, beyond what it returns)."""
    import tracemalloc

    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = fn(*args)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return result, peak - getattr(result, "nbytes", 0)


class _Operand(np.ndarray):
    """A view that notes the numpy operations it takes part in: the functions (`__array_function__`) and the
    ufuncs, `@` among them (`__array_ufunc__`). The check's storages and its as_strided hand them out."""

    noted = []

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        _Operand.noted.append(ufunc.__name__)
        plain = tuple(x.view(np.ndarray) if isinstance(x, _Operand) else x for x in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(x.view(np.ndarray) if isinstance(x, _Operand) else x for x in kwargs["out"])
        return getattr(ufunc, method)(*plain, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        _Operand.noted.append(func.__name__)
        return super().__array_function__(func, types, args, kwargs)


def _noting_as_strided(x, shape=None, strides=None, subok=False, writeable=True):
    """as_strided, keeping the _Operand it was given (subok), so that the view notes what it is used for."""
    return np.lib.stride_tricks.as_strided(x, shape, strides, subok=True, writeable=writeable)


def _reaches_gemm(your_blas_matmul):
    """The product goes to numpy's matmul (the `@` operator, np.matmul, np.dot: gemm). The function runs as
    plain Python on storages that note what their views take part in; einsum, for one, multiplies with its
    own loops: the same values and memory as gemm, several times its time. Views the check cannot follow
    (made without as_strided) are not judged."""
    a, b = View((2, 5, 6), "permuted"), View((6, 3), "sliced")
    run = AsPython({np.lib.stride_tricks.as_strided: _noting_as_strided}).function(your_blas_matmul, top=True)
    _Operand.noted = []
    try:
        run(a.storage.view(_Operand), _ints(a.shape), a.strides, b.storage.view(_Operand), _ints(b.shape), b.strides)
    except Exception:
        return ""
    noted = set(_Operand.noted)
    if noted and not noted & {"matmul", "dot", "tensordot", "inner"}:
        raise CheckFailed(
            f"your product never reached numpy's matmul: the views took part in {', '.join(sorted(noted))}. The "
            f"values and the memory are right, but only np.matmul (the `@` operator) hands the views to gemm, with "
            f"its register blocks, cache tiles and threads; the other ways multiply with loops of their own.\n  hint: "
            f"the exercise is the call into BLAS (lesson 06, section 14): the views go to it as they are.")
    return ", through np.matmul" if noted else ""


@exercise
def blas_matmul(your_blas_matmul):
    """blas_matmul(a, a_shape, a_strides, b, b_shape, b_strides) -> the product of two strided views."""
    require(not hasattr(your_blas_matmul, "py_func"),
            "`blas_matmul` is compiled with Numba; make it a plain Python function.",
            hint="inside @njit, np.dot calls scipy's copy of OpenBLAS, a second BLAS with its own threads; "
                 "from Python, np.matmul calls numpy's.")
    cases = [((2, 3), "contiguous", "permuted"), ((1, 2), "sliced", "contiguous"), ((2, 4), "permuted", "broadcast"),
             ((3, 2), "broadcast", "sliced")]
    for (ra, rb), a_kind, b_kind in cases:
        n, k, m = (int(v) for v in rng().integers(1, 9, size=3))
        batch = tuple(int(v) for v in rng().integers(1, 4, size=max(ra, rb) - 2))
        a = View(batch[len(batch) - (ra - 2):] + (n, k), a_kind)
        b = View(tuple(1 if rng().random() < 0.5 else d for d in batch[len(batch) - (rb - 2):]) + (k, m), b_kind)
        for dtype in (np.float64, np.float32):
            sa, sb = a.storage.astype(dtype), b.storage.astype(dtype)
            yours = your_blas_matmul(sa, _ints(a.shape), a.strides, sb, _ints(b.shape), b.strides)
            expected = np.matmul(a.numpy(), b.numpy())
            require(isinstance(yours, np.ndarray), f"return a numpy array, got {type(yours).__name__}.")
            require(yours.dtype == dtype, f"the product of two {dtype.__name__} views came back as {yours.dtype}.",
                    hint="let np.matmul pick the dtype from the operands")
            assert_close(yours, expected, what=f"the product of a {a_kind} {a.shape} and a {b_kind} {b.shape} "
                         f"view ({dtype.__name__})", rtol=1e-5 if dtype == np.float32 else 1e-12,
                         atol=1e-5 if dtype == np.float32 else 1e-12,
                         inputs={"a_strides": tuple(a.strides), "b_strides": tuple(b.strides)},
                         mistakes={"you read the storages as if they were contiguous: use the strides":
                                   np.matmul(a.as_if_contiguous(), b.as_if_contiguous())})
    # Memory: a transposed weight, as in x @ W.T, read in place by gemm. A copy of it shows in the peak.
    x, w = View((48, 400), "contiguous"), View((40, 400), "contiguous")
    wt_strides = w.strides[::-1].copy()
    result, extra = _traced_peak(your_blas_matmul, x.storage, _ints((48, 400)), x.strides, w.storage,
                                 _ints((400, 40)), wt_strides)
    assert_close(result, x.numpy() @ w.numpy().T, what="x @ w.T with w's transpose as a view", rtol=1e-12, atol=1e-12)
    operand = 400 * 40 * 8
    require(extra < operand // 2,
            f"multiplying a (48, 400) view by a transposed (400, 40) view allocated {extra:,} bytes beyond the "
            f"result: a copy of an operand ({operand:,} bytes). gemm reads a transposed matrix in place.",
            hint="numpy can read a storage through strides of your choosing; anything that makes an operand "
                 "contiguous on the way copies it.")
    gemm = _reaches_gemm(your_blas_matmul)
    return (f"{len(cases)} pairs of strided views with broadcast batch dims, float32 and float64, and no copy of x @ w.T"
            f"{gemm}")
