"""The CUDA backend of the chapter 02 tensor engine, with tensors that stay on the device.

    from course_lib.tensor import use_backend
    with use_backend("cuda"):
        y = (x @ w).relu().sum(1)          # every op is a kernel launch; y lives on the device
    y.numpy()                              # the one copy back to the host

What makes it fast is what it does not do:
- **No copy per op.** A result's storage is device memory (`memory.DeviceStorage`, from a caching
  pool), so the next op reads it where it is. Host data (a batch of inputs, the zeros the tensor layer
  makes) goes to the device once, when an op first needs it. Data comes back only when the host reads
  it: `.numpy()`, `.item()`, printing.
- **No synchronize per op.** Launches queue up on one stream and run in order; Python goes on to the
  next op while the GPU works. Only a read from the host waits.
- **No arrays of shapes and strides.** They go to a kernel as tuples of ints, which Numba passes as
  plain arguments, instead of small arrays copied to the device at every launch.
- **Short paths for the common cases.** Operands that are contiguous and of the output's shape use
  flat kernels (`out[i] = f(a[i])`), a number from the host is an argument (`x * 0.5`), Adam's whole
  update is one kernel, and matmul is register-blocked (each thread computes a block of C).

Strided and broadcast operands take the general path: a thread turns its row-major ordinal in the
output into a storage position for each operand with that operand's own strides (stride 0 for a
broadcast dim), with chapter 06's `position` (fast/position.py) compiled for the GPU.

One kernel per op name, compiled on first use around that op's scalar function in
tensor/scalar_ops.py (which never raises, so the simulator gives inf and nan where a GPU does).
"""

import math

import numpy as np

from course_lib import device
from course_lib.cuda.memory import POOL, DeviceStorage
from course_lib.fast import position as positions
from course_lib.tensor import scalar_ops
from course_lib.tensor.backend import Backend
from course_lib.tensor.broadcast import shape_broadcast
from course_lib.tensor.tensor_data import TensorData

device.setup(verbose=False)
from numba import cuda, float32, float64, int32  # noqa: E402  (after the device is chosen)

SIMULATED = device.using_simulator()
THREADS = 8 if SIMULATED else 256            # threads per block of the elementwise kernels
MAX_BLOCKS = 1 if SIMULATED else 2048        # more elements than threads: each thread loops (grid stride)

#: Storage position of element `ordinal` (row-major over `shape`) of a strided view: the very
#: function of fast/position.py, compiled for the GPU.
position = cuda.jit(device=True)(positions.position)


def _config(size):
    """(blocks, threads) for an elementwise launch over `size` elements."""
    threads = min(THREADS, -(-size // 32) * 32)
    return min(MAX_BLOCKS, -(-size // threads)), threads


# ---- kernel factories: one compiled kernel per op, around its function in scalar_ops.py -----------

def _map_kernels(fn):
    """(flat, strided) kernels of out = fn(a)."""
    fn = cuda.jit(device=True)(fn)

    @cuda.jit
    def flat(out, a, a_off, size):
        for i in range(cuda.grid(1), size, cuda.gridsize(1)):
            out[i] = fn(a[a_off + i])

    @cuda.jit
    def strided(out, out_st, out_off, a, a_st, a_off, shape, size):
        for i in range(cuda.grid(1), size, cuda.gridsize(1)):
            out[position(i, shape, out_st, out_off)] = fn(a[position(i, shape, a_st, a_off)])

    return flat, strided


def _zip_kernels(fn):
    """(flat, with a number on the left, with a number on the right, strided) kernels of out = fn(a, b)."""
    fn = cuda.jit(device=True)(fn)

    @cuda.jit
    def flat(out, a, a_off, b, b_off, size):
        for i in range(cuda.grid(1), size, cuda.gridsize(1)):
            out[i] = fn(a[a_off + i], b[b_off + i])

    @cuda.jit
    def number_left(out, x, b, b_off, size):
        for i in range(cuda.grid(1), size, cuda.gridsize(1)):
            out[i] = fn(x, b[b_off + i])

    @cuda.jit
    def number_right(out, a, a_off, y, size):
        for i in range(cuda.grid(1), size, cuda.gridsize(1)):
            out[i] = fn(a[a_off + i], y)

    @cuda.jit
    def strided(out, out_st, out_off, a, a_st, a_off, b, b_st, b_off, shape, size):
        for i in range(cuda.grid(1), size, cuda.gridsize(1)):
            x = a[position(i, shape, a_st, a_off)]
            y = b[position(i, shape, b_st, b_off)]
            out[position(i, shape, out_st, out_off)] = fn(x, y)

    return flat, number_left, number_right, strided


def _reduce_kernel(fold, start):
    """One thread per output element folds the n elements along the reduced dim, from `start`."""
    fold = cuda.jit(device=True)(fold)

    @cuda.jit
    def kernel(out, out_shape, a, a_st, a_off, n, step, size):
        for i in range(cuda.grid(1), size, cuda.gridsize(1)):
            first = position(i, out_shape, a_st, a_off)      # out's index is a's with 0 at dim
            acc = start
            for k in range(n):
                acc = fold(acc, a[first + k * step])
            out[i] = acc
    return kernel


@cuda.jit
def k_where(out, c, c_st, c_off, a, a_st, a_off, b, b_st, b_off, shape, size):
    for i in range(cuda.grid(1), size, cuda.gridsize(1)):
        pick = c[position(i, shape, c_st, c_off)] != 0
        out[i] = a[position(i, shape, a_st, a_off)] if pick else b[position(i, shape, b_st, b_off)]


def _adam_kernel(decoupled, per_parameter):
    """Adam's (decoupled=False) or AdamW's whole update, one thread per parameter, in float64 like
    chapter 06's kernel: m and v updated in place, the new parameters written to `out`."""

    @cuda.jit
    def kernel(out, p, p_off, g, g_off, m, v, decay, lr, b1, b2, eps, c1, c2, size):
        for i in range(cuda.grid(1), size, cuda.gridsize(1)):
            wd = decay[i] if per_parameter else decay[0]
            pi, gi = float64(p[p_off + i]), float64(g[g_off + i])
            if decoupled:
                pi = pi * (1.0 - lr * wd)
            else:
                gi = gi + wd * pi
            mi = b1 * m[i] + (1.0 - b1) * gi
            vi = b2 * v[i] + (1.0 - b2) * (gi * gi)
            m[i] = mi
            v[i] = vi
            out[i] = pi - lr * (mi / c1) / (math.sqrt(vi / c2) + eps)
    return kernel


def _matmul_kernel(dtype, BM, BN, BK, TM, TN):
    """Batched, register-blocked matmul over strided operands (chapter 07's 2D blocking, generalised):
    a block of (BN // TN, BM // TM) threads computes a BM x BN tile of one matrix of the batch (grid z);
    each thread keeps its TM x TN outputs, rows r + i * SY and columns c + j * SX, in registers. A's
    element (i, k) is a[a0 + i * a_st[0] + k * a_st[1]], so transposed operands need no copy."""
    SY, SX = BM // TM, BN // TN                   # a thread's rows are SY apart, its columns SX apart
    TMTN = TM * TN
    PAD = BM + 4                                  # the transposed A tile's padded rows (no bank conflict)
    jit = cuda.jit if SIMULATED else cuda.jit(launch_bounds=(SX * SY, 2))   # <= 128 registers: 2 blocks per SM

    @jit
    def kernel(out, a, b, batch, a_bst, b_bst, a_st, b_st, a_off, b_off, n, k, m):
        tile_a = cuda.shared.array((BK, PAD), dtype)
        tile_b = cuda.shared.array((BK, BN), dtype)
        c = cuda.local.array(TMTN, dtype)             # C's block, flat: c[i * TN + j]
        col = cuda.local.array(TN, dtype)
        n, k, m = int32(n), int32(k), int32(m)
        x0, y0 = int32(cuda.threadIdx.x), int32(cuda.threadIdx.y)
        z = cuda.blockIdx.z
        a0 = position(z, batch, a_bst, a_off)        # this matrix of the batch, in each operand's storage
        b0 = position(z, batch, b_bst, b_off)
        top, left = int32(cuda.blockIdx.y) * BM, int32(cuda.blockIdx.x) * BN
        for q in range(TMTN):
            c[q] = 0.0
        kk = int32(0)
        while kk < k:
            e = x0 + y0 * SX
            while e < BM * BK:                        # A's tile, read along k, stored transposed
                i, kq = top + e // BK, kk + e % BK
                tile_a[e % BK, e // BK] = a[a0 + i * a_st[0] + kq * a_st[1]] if i < n and kq < k else 0.0
                e += SX * SY
            e = x0 + y0 * SX
            while e < BK * BN:
                kq, j = kk + e // BN, left + e % BN
                tile_b[e // BN, e % BN] = b[b0 + kq * b_st[0] + j * b_st[1]] if kq < k and j < m else 0.0
                e += SX * SY
            cuda.syncthreads()
            for p in range(BK):
                for j in range(TN):
                    col[j] = tile_b[p, j * SX + x0]
                for i in range(TM):
                    x = tile_a[p, i * SY + y0]
                    for j in range(TN):
                        c[i * TN + j] += x * col[j]
            cuda.syncthreads()
            kk += BK
        for i in range(TM):
            r = top + i * SY + y0
            for j in range(TN):
                s = left + j * SX + x0
                if r < n and s < m:
                    out[(z * n + r) * m + s] = c[i * TN + j]
    return kernel


_KERNELS = {}


def _kernel(kind, key, make):
    if (kind, key) not in _KERNELS:
        _KERNELS[kind, key] = make()
    return _KERNELS[kind, key]


#: matmul tiles (BM, BN, BK, TM, TN): big ones on a GPU when C is big, small ones otherwise
#: (and on the simulator, where every thread costs ~130 µs)
BIG, SMALL = (128, 128, 8, 8, 8), (32, 32, 8, 2, 2)
TINY = (16, 16, 4, 4, 4)


# ---- operands ------------------------------------------------------------------------------------

def on_device(t):
    """The TensorData with its storage on the device (host storage is copied there once, whole)."""
    if isinstance(t.storage, DeviceStorage):
        return t
    return TensorData(DeviceStorage.upload(t.storage), t.shape, t.strides, t.offset)


def _number(t):
    """The value of a one-element operand that lives on the host, else None (it then stays an array)."""
    if t.size == 1 and isinstance(t.storage, np.ndarray):
        return t.storage[t.offset]
    return None


def _flat(t, shape):
    """True when t is laid out as a fresh array of `shape`: the flat kernels can index it with i."""
    return t.shape == shape and t.is_contiguous()


def _dims(t, shape):
    """Strides of t broadcast to `shape`, as a tuple; a 0-d view gets one dim of size 1."""
    return t.expand(shape).strides if shape else (0,)


def fresh(shape, dtype):
    """A contiguous TensorData with new device storage (from the pool, not zeroed)."""
    shape = tuple(shape)
    return TensorData.contiguous(DeviceStorage.empty(math.prod(shape), dtype), shape)


class CudaBackend(Backend):
    name = "cuda"

    # -- map and zip
    def map(self, op, a, out=None):
        shape = a.shape if out is None else out.shape
        result = fresh(shape, a.dtype if out is None else out.dtype) if out is None or not self._on_device(out) else out
        flat, strided = _kernel("map", op, lambda: _map_kernels(scalar_ops.MAP[op]))
        size = result.size
        if size:
            a = on_device(a)
            if result is not out and _flat(a, shape):
                flat[_config(size)](result.storage.array, a.storage.array, a.offset, size)
            else:
                strided[_config(size)](result.storage.array, _dims(result, shape), result.offset, a.storage.array,
                                       _dims(a, shape), a.offset, shape or (1,), size)
        return self._into(result, out)

    def zip(self, op, a, b, out=None):
        shape = shape_broadcast(a.shape, b.shape, op) if out is None else out.shape
        dtype = np.result_type(a.dtype, b.dtype) if out is None else out.dtype
        result = fresh(shape, dtype) if out is None or not self._on_device(out) else out
        flat, left, right, strided = _kernel("zip", op, lambda: _zip_kernels(scalar_ops.ZIP[op]))
        size = result.size
        if not size:
            return self._into(result, out)
        x, y = _number(a), _number(b)
        if result is not out and y is not None and _flat(a, shape) and a.dtype == dtype:
            a = on_device(a)
            right[_config(size)](result.storage.array, a.storage.array, a.offset, dtype.type(y), size)
        elif result is not out and x is not None and _flat(b, shape) and b.dtype == dtype:
            b = on_device(b)
            left[_config(size)](result.storage.array, dtype.type(x), b.storage.array, b.offset, size)
        else:
            a, b = on_device(a), on_device(b)
            if result is not out and _flat(a, shape) and _flat(b, shape) and a.dtype == b.dtype:
                flat[_config(size)](result.storage.array, a.storage.array, a.offset, b.storage.array, b.offset, size)
            else:
                strided[_config(size)](result.storage.array, _dims(result, shape), result.offset,
                                       a.storage.array, _dims(a, shape), a.offset, b.storage.array, _dims(b, shape),
                                       b.offset, shape or (1,), size)
        return self._into(result, out)

    @staticmethod
    def _on_device(t):
        return isinstance(t.storage, DeviceStorage)

    @staticmethod
    def _into(result, out):
        """The result, written into `out` when the caller gave one that lives on the host (the tensor layer
        makes its `cat` and slicing targets there): the one case where an op copies back."""
        if out is None or result is out:
            return result
        out.writable_numpy()[...] = result.to_numpy()
        return out

    def where(self, cond, a, b):
        shape = shape_broadcast(shape_broadcast(cond.shape, a.shape, "where"), b.shape, "where")
        result = fresh(shape, np.result_type(a.dtype, b.dtype))
        if result.size:
            cond, a, b = on_device(cond), on_device(a), on_device(b)
            k_where[_config(result.size)](result.storage.array, cond.storage.array, _dims(cond, shape), cond.offset,
                                          a.storage.array, _dims(a, shape), a.offset, b.storage.array,
                                          _dims(b, shape), b.offset, shape or (1,), result.size)
        return result

    # -- reduce
    def reduce(self, op, a, dim):
        shape = tuple(1 if d == dim else n for d, n in enumerate(a.shape))
        out = fresh(shape, a.dtype)
        if out.size:
            zip_op, start = scalar_ops.REDUCE[op]
            kernel = _kernel("reduce", op, lambda: _reduce_kernel(scalar_ops.ZIP[zip_op], start))
            a = on_device(a)
            kernel[_config(out.size)](out.storage.array, shape, a.storage.array, a.strides, a.offset,
                                      a.shape[dim], a.strides[dim], out.size)
        return out

    # -- matmul
    def matmul(self, a, b):
        (n, k), m = a.shape[-2:], b.shape[-1]
        batch = shape_broadcast(a.shape[:-2], b.shape[:-2], "matmul")
        a, b = a.expand(batch + (n, k)), b.expand(batch + (k, m))
        dtype = np.result_type(a.dtype, b.dtype)
        nbatch = math.prod(batch)
        if n * m * nbatch == 0:
            return fresh(batch + (n, m), dtype)
        if k == 0:
            return self.zip("mul", fresh(batch + (n, m), dtype), TensorData.from_numpy(0.0, dtype))
        if a.dtype != dtype or b.dtype != dtype:              # one dtype inside the kernel: the wider
            a, b = (self.map("id", t, fresh(t.shape, dtype)) if t.dtype != dtype else t for t in (a, b))
        tiles = TINY if SIMULATED else BIG if n * m >= 256 * 256 else SMALL
        BM, BN = tiles[:2]
        kernel = _kernel("matmul", (dtype, tiles),
                         lambda: _matmul_kernel(float32 if dtype == np.float32 else float64, *tiles))
        a, b = on_device(a), on_device(b)
        out = fresh(batch + (n, m), dtype)
        grid = (-(-m // BN), -(-n // BM), nbatch)
        block = (BN // tiles[4], BM // tiles[3])
        kernel[grid, block](out.storage.array, a.storage.array, b.storage.array, batch or (1,),
                            a.strides[:-2] or (0,), b.strides[:-2] or (0,), a.strides[-2:], b.strides[-2:],
                            a.offset, b.offset, n, k, m)
        return out

    # -- Adam (optional in the interface; optim.Adam calls it)
    def adam(self, p, g, m, v, lr, betas, eps, t, decay, decoupled):
        """One fused Adam step over flat contiguous vectors: m and v updated in place (they move to the
        device at the first step and stay there), the new parameters returned."""
        for state in (m, v):
            if not self._on_device(state):
                state.storage = DeviceStorage.upload(state.to_numpy())    # the optimizer's own zeros, moved once
                state.offset = 0
        per_parameter = isinstance(decay, TensorData)
        if per_parameter:
            decay = on_device(decay)          # kept in a variable: its memory must not go back to the pool yet
            decay_array = decay.storage.array[decay.offset:] if decay.offset else decay.storage.array
        else:
            decay_array = self._decay(decay or 0.0)
        p, g = on_device(p), on_device(g)
        out = fresh(p.shape, p.dtype)
        b1, b2 = betas
        kernel = _kernel("adam", (decoupled, per_parameter), lambda: _adam_kernel(decoupled, per_parameter))
        kernel[_config(p.size)](out.storage.array, p.storage.array, p.offset, g.storage.array, g.offset,
                                m.storage.array, v.storage.array, decay_array, float(lr), float(b1), float(b2), float(eps),
                                1.0 - b1 ** t, 1.0 - b2 ** t, p.size)
        return out

    def _decay(self, value):
        """A one-element device array holding a weight decay (kept: the same few values every step)."""
        cache = self.__dict__.setdefault("_decays", {})
        if value not in cache:
            cache[value] = cuda.to_device(np.array([value], np.float64))
        return cache[value]

    def synchronize(self):
        """Wait for every queued kernel (for timing; a read from the host waits by itself)."""
        cuda.synchronize()

    def pool(self):
        return POOL


backend = CudaBackend()
