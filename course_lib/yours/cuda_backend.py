"""Your chapter 07 kernels as a backend of the tensor engine: `set_backend("yours-cuda")`.

    from course_lib.yours import cuda_backend
    cuda_backend.build()            # checks your saved kernels again; one line says whose runs what
    with T.use_backend("yours-cuda"):
        logits = model(x)           # its matmuls are your matmul_tiled, its sums your row_sum

Most puzzles compute one fixed thing (add 10, reverse a block); these four generalise to ops:
    matmul, float32       your matmul_tiled, once per matrix of the batch (else matmul_naive)
    matmul, float64       your matmul_naive (matmul_tiled's tiles are float32)
    reduce "sum"          your row_sum: the reduced dim is moved last, so each row is one line
    zip "add"             your zip_add, for up to 1,024 elements (it runs in one block, unguarded)
Everything else (map, the other zips, bigger adds, reduce "max", where) runs on the course's
CUDA backend, and so does a piece you have not saved (or after `yours.use("07", False)`).

Operands are copied into contiguous arrays of the shapes your kernels take; a broadcast operand
is copied out in full. On the simulator every thread costs about 130 µs: keep tensors small.
"""

import numpy as np

from course_lib.cuda.launch import blocks_for, launch
from course_lib.tensor.broadcast import shape_broadcast
from course_lib.tensor.tensor_data import TensorData
from course_lib.yours import backends

NAME = "yours-cuda"
#: the exercises used here, with the constant each one's check takes after the kernel
PIECES = {"zip_add": None, "row_sum": "TPB", "matmul_naive": None, "matmul_tiled": "TILE"}
ONE_BLOCK = 1024  # zip_add has no guard and reads only threadIdx.x: one block, at most this many threads


def _module_globals(kernel):
    """The globals of your saved module, as the kernel (on a GPU or on the simulator) sees them."""
    return (getattr(kernel, "py_func", None) or getattr(kernel, "fn", None) or kernel).__globals__


def _constant(kernel, name):
    """A constant of your saved module (TPB, TILE)."""
    return _module_globals(kernel)[name]


def _copy(array, dtype):
    """A fresh C-contiguous copy: `launch` copies every array argument back from the device, so
    an input must never be a view of a tensor's storage (or a read-only broadcast)."""
    return np.array(array, dtype=dtype, order="C", copy=True)


def _result(array, shape):
    return TensorData.contiguous(np.ascontiguousarray(array).reshape(-1), tuple(shape))


class YoursCudaBackend(backends.BackendOfYours):
    """matmul, reduce "sum" and small zip "add" on your kernels where given; the rest on `course`, the
    course's CUDA backend. `calls` counts your kernels' launches."""

    name = NAME

    def whose(self):
        """[(op, the name of your kernel that runs it, or None: the course's)] for the backend's ops."""
        matmul = next((k for k in ("matmul_tiled", "matmul_naive") if k in self.kernels), None)
        return [("matmul", matmul), ("reduce sum", "row_sum" if "row_sum" in self.kernels else None),
                ("zip add (up to 1,024 elements)", "zip_add" if "zip_add" in self.kernels else None),
                ("map", None), ("the other zips", None), ("reduce max", None), ("where", None)]

    def _matmul(self, dtype):
        """(name, kernel, block) of your matmul for `dtype`, or None."""
        if dtype == np.float32 and "matmul_tiled" in self.kernels:
            tile = _constant(self.kernels["matmul_tiled"], "TILE")
            return "matmul_tiled", self.kernels["matmul_tiled"], (tile, tile)
        if "matmul_naive" in self.kernels:
            return "matmul_naive", self.kernels["matmul_naive"], (8, 8)
        return None

    def zip(self, op, a, b, out=None):
        kernel = self.kernels.get("zip_add")
        shape = shape_broadcast(a.shape, b.shape) if out is None else out.shape
        size = int(np.prod(shape, dtype=np.int64))
        if op != "add" or kernel is None or not 0 < size <= ONE_BLOCK:
            return self.course.zip(op, a, b, out)
        dtype = np.result_type(a.dtype, b.dtype) if out is None else out.dtype
        x = _copy(np.broadcast_to(a.to_numpy(), shape), dtype).reshape(-1)
        y = _copy(np.broadcast_to(b.to_numpy(), shape), dtype).reshape(-1)
        result = np.empty(size, dtype)
        launch(kernel, 1, size, x, y, result)
        self.calls["zip_add"] += 1
        if out is None:
            return _result(result, shape)
        out.writable_numpy()[...] = result.reshape(shape)
        return out

    def reduce(self, op, a, dim):
        kernel = self.kernels.get("row_sum")
        if op != "sum" or kernel is None:
            return self.course.reduce(op, a, dim)
        shape = a.shape[:dim] + (1,) + a.shape[dim + 1:]
        rows = _copy(np.moveaxis(a.to_numpy(), dim, -1), a.dtype).reshape(-1, a.shape[dim])  # a line per row
        out = np.empty(rows.shape[0], a.dtype)
        if out.size:
            launch(kernel, out.size, _constant(kernel, "TPB"), rows, out)
            self.calls["row_sum"] += 1
        return _result(out, shape)

    def matmul(self, a, b):
        dtype = np.result_type(a.dtype, b.dtype)
        mine = self._matmul(dtype)
        if mine is None:
            return self.course.matmul(a, b)
        name, kernel, block = mine
        A, B, batch = backends.matrix_pairs(a, b)
        n, m = A.shape[1], B.shape[2]
        out = np.zeros((A.shape[0], n, m), dtype)
        if out.size:
            grid = (blocks_for(m, block[0]), blocks_for(n, block[1]))
            for t in range(out.shape[0]):        # your kernel multiplies one pair of matrices
                C = np.empty((n, m), dtype)
                launch(kernel, grid, block, _copy(A[t], dtype), _copy(B[t], dtype), C)
                out[t] = C
                self.calls[name] += 1
        return _result(out, batch + (n, m))

    def map(self, op, a, out=None):
        return self.course.map(op, a, out)

    def where(self, cond, a, b):
        return self.course.where(cond, a, b)


def describe(backend):
    """The one line: which of the backend's ops run on your kernels, and which on the course's."""
    return backends.describe("07", NAME, backend.whose())


def build(verify=True, quiet=False):
    """The backend on your saved chapter 07 kernels (each checked again first), registered as
    "yours-cuda". A saved kernel that fails its check raises CheckFailed naming it."""
    return backends.build("07", NAME, YoursCudaBackend, "cuda", PIECES, verify, quiet)
