"""Your chapter 06 kernels as a backend of the tensor engine: `use_backend("yours-numba")`.

    from course_lib.yours import numba_backend
    backend = numba_backend.build()      # checks your saved kernels again; one line says whose runs what
    with T.use_backend("yours-numba"):
        loss = T.cross_entropy(model(x), y)

Which of your kernels runs a call, in the order the backend tries them:

    map                a copy (op "id") of strided views: your strided_copy (exercise 9)
                       contiguous operands: your flat_map (exercise 7); any other view: your strided_map
    zip                contiguous operands that your row_layout (exercise 8) can read as rows: your
                       flat_zip; any other views, broadcast or not: your strided_zip
    reduce "sum"       over a dim other than the last of contiguous data: your sum_columns (exercise 10);
                       the last dim, or any view: your sum_dim (and its sum_kernel)
    matmul             your blas_matmul (exercise 11); without it, your matmul, one matrix pair at a time
    reduce "max", where    the course's Numba backend (no exercise wrote them)

A kernel you have not saved (or `yours.use("06", False)`) hands its calls to the next one that serves
them, and in the end to the course's Numba backend; `whose()` and the line `build` prints say which.

The op arrives in your kernels as `fn`, the course's scalar function for it (tensor/scalar_ops.py), in
two forms. Your strided kernels get a `cfunc`: compiled once, called through a pointer; every op has the
same Numba type, so a strided kernel compiles once per dtype for all the ops. Your flat kernels get an
`@njit` function: Numba then compiles the kernel once per op, with the op inlined, and its loop
vectorizes (chapter 06, section 10, times both). A view's offset is applied by slicing its storage, as
the exercises' kernels expect (they read position 0 of the storage as the view's first element).

`meter`, when set (chapter 12's payoff sets one), times every kernel call by whose kernel ran it.
"""

import functools
import math

import numba
import numpy as np
from numba import cfunc, njit

from course_lib.fast.indexing import as_int_array
from course_lib.fast.indexing import flat as _flat
from course_lib.fast.indexing import fresh as _fresh
from course_lib.fast.plans import run_shape, strides
from course_lib.fast.pool import set_threads  # your strided kernels are parallel; small work runs on one thread
from course_lib.tensor import scalar_ops
from course_lib.tensor.broadcast import shape_broadcast
from course_lib.tensor.tensor_data import TensorData
from course_lib.yours import backends

NAME = "yours-numba"
PIECES = ("strided_map", "strided_zip", "sum_dim", "sum_kernel", "matmul",
          "flat_map", "flat_zip", "row_layout", "strided_copy", "sum_columns", "blas_matmul")


# ---- the op, as the `fn` your kernels call ----------------------------------------------------------

def _table(op):
    return scalar_ops.MAP[op] if op in scalar_ops.MAP else scalar_ops.ZIP[op]


@functools.cache
def op_pointer(op):
    """The op as a cfunc (float64; float32 converts on the way): what your strided kernels call."""
    signature = "float64(float64)" if op in scalar_ops.MAP else "float64(float64, float64)"
    return cfunc(signature, cache=True)(_table(op))


@functools.cache
def op_inlined(op):
    """The op as an @njit function: what your flat kernels call, compiled into them per op."""
    return njit(cache=True, error_model="numpy")(_table(op))


# ---- views as your kernels take them ----------------------------------------------------------------

# a shape or strides as an int64 array, cached: a training loop asks for the same few
_ints = functools.lru_cache(maxsize=4096)(as_int_array)


@functools.lru_cache(maxsize=4096)
def _as_rows(a_shape, b_shape, shape):
    """The three shapes as matrices (rows, cols), or None: where each operand is either all of the output or
    repeats it along leading dims only (x (B, T, C) + pos (T, C)), the trailing dims flatten into one row,
    and your row_layout then reads the repeated operand as a row. The data do not move."""
    splits = []
    for s in (a_shape, b_shape):
        padded = (1,) * (len(shape) - len(s)) + tuple(s)
        lead = 0
        while lead < len(shape) and padded[lead] == 1 and shape[lead] != 1:
            lead += 1
        if padded[lead:] != shape[lead:]:
            return None
        splits.append(lead)
    lead = max(splits)
    if lead == 0 or lead == len(shape):
        return None
    rows, cols = math.prod(shape[:lead]), math.prod(shape[lead:])
    return tuple((rows, cols) if split == 0 else (cols,) for split in splits) + ((rows, cols),)


def _storage(view):
    """The view's storage from its first element on (your kernels read position 0 as the offset)."""
    return view.storage[view.offset:] if view.offset else view.storage


class YoursNumbaBackend(backends.BackendOfYours):
    """map, zip, reduce "sum" and matmul on your kernels (the names of PIECES) where they are given; the
    rest on `course`, the course's Numba backend."""

    name = NAME

    def __init__(self, kernels, course):
        super().__init__(kernels, course)
        self.meter = None                   # chapter 12's meter, while it measures a step
        self._entries = {}                  # your kernels' compiled versions, by argument types (_compiled)
        row_layout = self.kernels.get("row_layout")
        # your row_layout depends on the shapes only: worked out once per pair of shapes, then looked up
        self._layout = functools.lru_cache(maxsize=4096)(row_layout) if row_layout else None

    def whose(self):
        """[(op, the name of your kernel that runs it, or None: the course's)] for the backend's calls."""
        k = self.kernels
        rows = [("copy of strided views", "strided_copy" if "strided_copy" in k else
                 "strided_map" if "strided_map" in k else None),
                ("map, contiguous", "flat_map" if "flat_map" in k else "strided_map" if "strided_map" in k else None),
                ("map, strided", "strided_map" if "strided_map" in k else None),
                ("zip, contiguous", "flat_zip" if {"flat_zip", "row_layout"} <= set(k) else
                 "strided_zip" if "strided_zip" in k else None),
                ("zip, strided", "strided_zip" if "strided_zip" in k else None),
                ("sum, down contiguous columns", "sum_columns" if "sum_columns" in k else
                 "sum_dim" if "sum_dim" in k else None),
                ("sum, other", "sum_dim" if "sum_dim" in k else None),
                ("matmul", "blas_matmul" if "blas_matmul" in k else "matmul" if "matmul" in k else None)]
        return rows + [("reduce max", None), ("where", None)]

    # -- running a kernel: counted, and timed while chapter 12 measures
    def _run(self, name, kernel, *args):
        self.calls[name] += 1
        compiled = self._compiled(kernel, args)
        if self.meter is None:
            return compiled(*args)
        return self.meter.leaf("yours", name, compiled, *args)

    def _compiled(self, kernel, args):
        """The machine code of your kernel for these arguments' types, to call without Numba's dispatch.

        Before it runs a compiled function, Numba works out the Numba type of every argument to pick
        (or compile) the version for them. For an argument that is itself a compiled function, the `fn`
        of your kernels, that takes tens of microseconds, more than the kernel itself on a small tensor.
        The types of a call depend only on the arrays' dtypes and dims and on which op `fn` is, so the
        backend asks Numba once per combination (the first call compiles if need be) and then calls that
        version's entry point directly. A kernel that is a plain Python function is called as it is."""
        if not hasattr(kernel, "overloads"):
            return kernel
        key = (id(kernel),) + tuple((x.dtype.char, x.ndim, x.flags.c_contiguous) if isinstance(x, np.ndarray)
                                    else id(x) if callable(x) else type(x) for x in args)
        entry = self._entries.get(key)
        if entry is None:
            types = tuple(numba.typeof(x) for x in args)
            kernel.compile(types)
            found = kernel.overloads.get(types)
            entry = self._entries[key] = found.entry_point if found is not None else kernel
        return entry

    def _course(self, name, method, *args):
        if self.meter is None:
            return method(*args)
        return self.meter.leaf("course", name, method, *args)

    # -- the four loops
    def map(self, op, a, out=None):
        out = _fresh(a.shape, a.dtype) if out is None else out
        if not out.size:
            return out
        k = self.kernels
        same = a.shape == out.shape and a.is_contiguous() and out.is_contiguous()
        if same and "flat_map" in k:
            self._run("flat_map", k["flat_map"], op_inlined(op), _flat(out), _flat(a))
        elif op == "id" and "strided_copy" in k:
            self._run("strided_copy", k["strided_copy"], _storage(out), run_shape(out.shape), strides(out, out.shape),
                      _storage(a), strides(a, out.shape))
        elif "strided_map" in k:
            set_threads(out.size)
            self._run("strided_map", k["strided_map"], op_pointer(op), _storage(out), run_shape(out.shape),
                      strides(out, out.shape), _storage(a), strides(a, out.shape))
        else:
            return self._course(f"map {op}", self.course.map, op, a, out)
        return out

    def zip(self, op, a, b, out=None):
        k = self.kernels
        shape = shape_broadcast(a.shape, b.shape)
        if out is None:
            out = _fresh(shape, a.dtype if a.dtype is b.dtype else np.result_type(a.dtype, b.dtype))
        if not out.size:
            return out
        layouts, rows = None, (a.shape, b.shape, shape)
        if self._layout and "flat_zip" in k and a.is_contiguous() and b.is_contiguous() and out.is_contiguous():
            layouts = self._layout(a.shape, shape), self._layout(b.shape, shape)
            if None in layouts and (rows := _as_rows(a.shape, b.shape, shape)) is not None:
                layouts = self._layout(rows[0], rows[2]), self._layout(rows[1], rows[2])
        if layouts and None not in layouts:
            (a_row, a_spread), (b_row, b_spread) = layouts
            self._run("flat_zip", k["flat_zip"], op_inlined(op), _flat(out), rows[2][-1] if rows[2] else 1,
                      _flat(a), a_row, a_spread, _flat(b), b_row, b_spread)
        elif "strided_zip" in k:
            set_threads(out.size)
            self._run("strided_zip", k["strided_zip"], op_pointer(op), _storage(out), run_shape(shape),
                      strides(out, shape), _storage(a), run_shape(a.shape), _ints(a.strides or (0,)),
                      _storage(b), run_shape(b.shape), _ints(b.strides or (0,)))
        else:
            return self._course(f"zip {op}", self.course.zip, op, a, b, out)
        return out

    def reduce(self, op, a, dim):
        k = self.kernels
        shape = a.shape[:dim] + (1,) + a.shape[dim + 1:]
        if op != "sum" or not ({"sum_columns", "sum_dim"} & set(k)):
            return self._course(f"reduce {op}", self.course.reduce, op, a, dim)
        if not math.prod(shape):
            return _fresh(shape, a.dtype)
        inner = math.prod(a.shape[dim + 1:])
        if "sum_columns" in k and inner > 1 and a.is_contiguous():
            sums = np.empty(math.prod(shape), dtype=np.float64)    # the sums add up in float64
            self._run("sum_columns", k["sum_columns"], sums, _flat(a), a.shape[dim], inner)
        elif "sum_dim" in k:
            set_threads(a.size)
            sums = self._run("sum_dim", k["sum_dim"], _storage(a), _ints(a.shape).copy(), _ints(a.strides), dim)
        else:
            return self._course("reduce sum", self.course.reduce, op, a, dim)
        return TensorData.contiguous(np.ascontiguousarray(sums, dtype=a.dtype).reshape(-1), shape)

    def matmul(self, a, b):
        k = self.kernels
        (n, _), m = a.shape[-2:], b.shape[-1]
        if "blas_matmul" in k:
            product = self._run("blas_matmul", k["blas_matmul"], _storage(a), _ints(a.shape), _ints(a.strides),
                                _storage(b), _ints(b.shape), _ints(b.strides))
            product = np.ascontiguousarray(product, dtype=np.result_type(a.dtype, b.dtype))
            return TensorData.contiguous(product.reshape(-1), tuple(int(s) for s in product.shape))
        if "matmul" not in k:
            return self._course("matmul", self.course.matmul, a, b)
        dtype = np.result_type(a.dtype, b.dtype)
        A, B, batch = backends.matrix_pairs(a, b)
        out = np.empty((A.shape[0], n, m), dtype=dtype)
        set_threads(n * a.shape[-1] * m // 16)
        for t in range(out.shape[0] if out.size else 0):   # your kernel multiplies one pair of matrices
            self._run("matmul", k["matmul"], out[t], np.ascontiguousarray(A[t], dtype=dtype),
                      np.ascontiguousarray(B[t], dtype=dtype))
        return TensorData.contiguous(out.reshape(-1), batch + (n, m))

    def where(self, cond, a, b):
        return self._course("where", self.course.where, cond, a, b)


def describe(backend):
    """The one line: which of the backend's calls run on your kernels, and which on the course's."""
    return backends.describe("06", NAME, backend.whose())


def build(verify=True, quiet=False):
    """The backend on your saved chapter 06 kernels (each checked again first), registered as
    "yours-numba". A saved kernel that fails its check raises CheckFailed naming it."""
    return backends.build("06", NAME, YoursNumbaBackend, "numba", PIECES, verify, quiet)
