"""The CUDA backend of the chapter 02 tensor engine: map, zip, reduce and matmul as kernels.

    from course_lib.tensor import use_backend
    with use_backend("cuda"):
        y = (x @ w).relu().sum(1)          # every op runs as a CUDA kernel

Strided data is handled on the device: a thread turns its row-major ordinal in the
output into a storage position for each operand with that operand's own strides.
Broadcasting is done before the launch with `TensorData.expand` (stride 0), so the
kernels never need to know about it. Each call copies the storages to the device and
the output back (simple, not fast: a real engine keeps tensors on the device).

One kernel per op name, compiled on first use around that op's scalar function, the plain
Python function of tensor/scalar_ops.py (which never raises, so the simulator gives inf and nan
where a GPU does).
"""

import numpy as np
from numba import cuda, float32, float64

from course_lib.cuda.launch import blocks_for, launch
from course_lib.fast import position as positions
from course_lib.tensor import scalar_ops
from course_lib.tensor.backend import Backend
from course_lib.tensor.broadcast import shape_broadcast
from course_lib.tensor.tensor_data import TensorData

THREADS = 128   # most threads per block of the elementwise kernels
TILE = 16       # matmul tile (8 for small matrices)


# ---- strided positions -------------------------------------------------------------------------

#: Storage position of element `ordinal` (row-major over `shape`) of a strided view: the very
#: function of fast/position.py, compiled for the GPU.
position = cuda.jit(device=True)(positions.position)


# ---- kernel factories: one compiled kernel per op, around its function in scalar_ops.py -----------

def _map_kernel(fn):
    fn = cuda.jit(device=True)(fn)

    @cuda.jit
    def kernel(out, shape, out_strides, out_offset, a, a_strides, a_offset, size):
        i = cuda.grid(1)
        if i < size:
            out[position(i, shape, out_strides, out_offset)] = fn(a[position(i, shape, a_strides, a_offset)])
    return kernel


def _zip_kernel(fn):
    fn = cuda.jit(device=True)(fn)

    @cuda.jit
    def kernel(out, shape, out_strides, out_offset, a, a_strides, a_offset, b, b_strides, b_offset, size):
        i = cuda.grid(1)
        if i < size:
            x = a[position(i, shape, a_strides, a_offset)]
            y = b[position(i, shape, b_strides, b_offset)]
            out[position(i, shape, out_strides, out_offset)] = fn(x, y)
    return kernel


def _reduce_kernel(fold, start):
    """One thread per output element folds the n elements along the reduced dim, from `start`."""
    fold = cuda.jit(device=True)(fold)

    @cuda.jit
    def kernel(out, out_shape, a, a_strides, a_offset, n, step, size):
        i = cuda.grid(1)
        if i < size:
            first = position(i, out_shape, a_strides, a_offset)     # out's index is a's with 0 at dim
            acc = start
            for k in range(n):
                acc = fold(acc, a[first + k * step])
            out[i] = acc
    return kernel


def _threads(size):
    """Threads per block: whole warps, no more than the work needs (idle threads cost on the simulator)."""
    return min(THREADS, blocks_for(size, 32) * 32)


def _matmul_kernel(dtype, TILE):
    """Tiled batched matmul (see matmul.py) over strided operands; grid z runs over the batch."""
    @cuda.jit
    def kernel(out, a, b, batch_shape, a_bstrides, b_bstrides, a_st, b_st, a_offset, b_offset, n, k, m):
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        col, row = cuda.grid(2)
        z = cuda.blockIdx.z
        a0 = position(z, batch_shape, a_bstrides, a_offset)
        b0 = position(z, batch_shape, b_bstrides, b_offset)
        sA = cuda.shared.array((TILE, TILE), dtype)
        sB = cuda.shared.array((TILE, TILE), dtype)
        acc = 0.0
        for t in range((k + TILE - 1) // TILE):
            kk = t * TILE
            sA[ty, tx] = a[a0 + row * a_st[0] + (kk + tx) * a_st[1]] if row < n and kk + tx < k else 0.0
            sB[ty, tx] = b[b0 + (kk + ty) * b_st[0] + col * b_st[1]] if kk + ty < k and col < m else 0.0
            cuda.syncthreads()
            for j in range(TILE):
                acc += sA[ty, j] * sB[j, tx]
            cuda.syncthreads()
        if row < n and col < m:
            out[(z * n + row) * m + col] = acc
    return kernel


_KERNELS = {}


def _kernel(kind, key, make):
    if (kind, key) not in _KERNELS:
        _KERNELS[kind, key] = make()
    return _KERNELS[kind, key]


# ---- the backend ---------------------------------------------------------------------------------

def _ints(values):
    """Shape or strides as a device-friendly int64 array; a 0-d view becomes shape (1,)."""
    return np.array(values if len(values) else (1,), dtype=np.int64)


def _strides(t, shape):
    return _ints(t.strides if len(shape) else (0,))


class CudaBackend(Backend):
    name = "cuda"

    def _elementwise(self, kernel, out, inputs):
        if out.size == 0:
            return out
        shape = _ints(out.shape)
        args = [out.storage, shape, _strides(out, out.shape), out.offset]
        for t in inputs:
            t = t.expand(out.shape)                       # broadcasting = stride 0
            args += [t.storage, _strides(t, out.shape), t.offset]
        launch(kernel, blocks_for(out.size, _threads(out.size)), _threads(out.size), *args, out.size)
        return out

    def map(self, op, a, out=None):
        out = TensorData.zeros(a.shape, a.dtype) if out is None else out
        kernel = _kernel("map", op, lambda: _map_kernel(scalar_ops.MAP[op]))
        return self._elementwise(kernel, out, [a])

    def zip(self, op, a, b, out=None):
        if out is None:
            out = TensorData.zeros(shape_broadcast(a.shape, b.shape, op), np.result_type(a.dtype, b.dtype))
        kernel = _kernel("zip", op, lambda: _zip_kernel(scalar_ops.ZIP[op]))
        return self._elementwise(kernel, out, [a, b])

    def reduce(self, op, a, dim):
        shape = tuple(1 if d == dim else n for d, n in enumerate(a.shape))
        out = TensorData.zeros(shape, a.dtype)
        if out.size:
            zip_op, start = scalar_ops.REDUCE[op]
            kernel = _kernel("reduce", op, lambda: _reduce_kernel(scalar_ops.ZIP[zip_op], start))
            launch(kernel, blocks_for(out.size, _threads(out.size)), _threads(out.size), out.storage, _ints(shape),
                   a.storage, _ints(a.strides), a.offset, a.shape[dim], a.strides[dim], out.size)
        return out

    def matmul(self, a, b):
        (n, k), m = a.shape[-2:], b.shape[-1]
        batch = shape_broadcast(a.shape[:-2], b.shape[:-2], "matmul")
        a, b = a.expand(batch + (n, k)), b.expand(batch + (k, m))
        dtype = np.result_type(a.dtype, b.dtype)
        out = TensorData.zeros(batch + (n, m), dtype)
        nbatch = int(np.prod(batch, dtype=np.int64))
        if out.size == 0:
            return out
        if k == 0:
            return out                                     # an empty sum is 0
        tile = 8 if max(n, m) <= 8 else TILE
        kernel = _kernel("matmul", (dtype, tile),
                         lambda: _matmul_kernel(float32 if dtype == np.float32 else float64, tile))
        grid = (blocks_for(m, tile), blocks_for(n, tile), nbatch)
        launch(kernel, grid, (tile, tile), out.storage, a.storage, b.storage, _ints(batch),
               _ints(a.strides[:-2] if batch else (0,)), _ints(b.strides[:-2] if batch else (0,)),
               _ints(a.strides[-2:]), _ints(b.strides[-2:]), a.offset, b.offset, n, k, m)
        return out


backend = CudaBackend()
