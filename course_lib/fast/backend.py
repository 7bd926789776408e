"""The Numba backend for chapter 02's tensor engine: `set_backend("numba")`.

Chapter 02's interface is four loops (map, zip, reduce, where) and matmul. Each loop here makes one choice:

    every operand contiguous      a flat kernel (flat.py): one pass over the storage, vectorized. An
                                  operand may also be a row, a column or one number repeated over a
                                  contiguous output (a bias, x - x.max(dim=-1), a learning rate).
    anything else                 a strided kernel (ops.py): permuted, sliced or broadcast views, read
                                  where they lie through their strides, with no copy.

The op arrives by name and goes into the kernels as its code (tensor/scalar_ops.py). A view goes into a
strided kernel as its storage, offset and int64 strides (read as the output's shape: stride 0 along a
broadcast dim); a 0-d tensor runs as shape (1,) with stride 0. matmul is BLAS's (blas.py), and one
optional method goes beyond the interface: `adam`, Adam's whole update as one kernel (adam.py), which
optim.Adam calls when the backend has it.

What a call works out from its shapes alone (which flat kernel, one thread or the pool, numpy's SIMD
math for exp, log, tanh and sigmoid) is worked out once per shape and cached, in plans.py: that is what
makes the backend fast on small tensors, and it is all this file leaves out.
"""

import numpy as np

from course_lib.fast import blas, plans
from course_lib.fast.indexing import flat, fresh
from course_lib.fast.ops import map_kernel, reduce_kernel, where_kernel, zip_kernel
from course_lib.fast.plans import run_shape, strides
from course_lib.fast.pool import set_threads
from course_lib.tensor.backend import Backend
from course_lib.tensor.broadcast import shape_broadcast
from course_lib.tensor.scalar_ops import MAP_CODE, REDUCE_CODE, ZIP_CODE
from course_lib.tensor.tensor_data import TensorData


class NumbaBackend(Backend):
    name = "numba"

    def map(self, op, a, out=None):
        out = fresh(a.shape, a.dtype) if out is None else out
        if not out.size:
            return out
        if op == "id":  # a copy: numpy's copy loops walk any strides in the best order (4x faster than ops.py's)
            np.copyto(out.to_numpy(), a.to_numpy())
        elif a.size == out.size and a.is_contiguous() and out.is_contiguous():
            plans.map_plan(op, a.shape)(flat(out), flat(a))
        else:
            shape = out.shape
            set_threads(out.size)
            map_kernel(MAP_CODE[op], out.storage, out.offset, run_shape(shape), strides(out, shape),
                       a.storage, a.offset, strides(a, shape))
        return out

    def zip(self, op, a, b, out=None):
        shape, flat_kernel = plans.zip_plan(op, a.shape, b.shape)
        if out is None:
            out = fresh(shape, a.dtype if a.dtype is b.dtype else np.result_type(a.dtype, b.dtype))
        if not out.size:
            return out
        if flat_kernel and a.is_contiguous() and b.is_contiguous() and out.is_contiguous():
            flat_kernel(flat(out), flat(a), flat(b))
        else:
            set_threads(out.size)
            zip_kernel(ZIP_CODE[op], out.storage, out.offset, run_shape(shape), strides(out, shape),
                       a.storage, a.offset, strides(a, shape), b.storage, b.offset, strides(b, shape))
        return out

    def reduce(self, op, a, dim):
        shape, flat_kernel = plans.reduce_plan(op, a.shape, dim)
        out = fresh(shape, a.dtype)
        if not out.size:
            return out
        if flat_kernel and a.is_contiguous():
            flat_kernel(out.storage, flat(a))
        else:
            set_threads(a.size)
            reduce_kernel(REDUCE_CODE[op], out.storage, run_shape(shape), a.storage, a.offset,
                          strides(a, a.shape), dim, a.shape[dim])
        return out

    def where(self, cond, a, b):
        shape = shape_broadcast(shape_broadcast(cond.shape, a.shape), b.shape)
        out = fresh(shape, np.result_type(a.dtype, b.dtype))
        if not out.size:
            return out
        flat_kernel = plans.where_plan(shape, cond.shape, a.shape, b.shape)
        if flat_kernel and cond.is_contiguous() and a.is_contiguous() and b.is_contiguous():
            flat_kernel(flat(out), flat(cond), flat(a), flat(b))
        else:
            set_threads(out.size)
            where_kernel(out.storage, run_shape(shape), cond.storage, cond.offset, strides(cond, shape),
                         a.storage, a.offset, strides(a, shape), b.storage, b.offset, strides(b, shape))
        return out

    def matmul(self, a, b):
        return blas.matmul(a, b)

    def adam(self, p, g, m, v, lr, betas, eps, t, decay, decoupled):
        """One fused Adam step over flat contiguous vectors (fast/adam.py): updates m and v in place and
        returns the new p. decay: None, one number, or a vector with one number per parameter."""
        new = fresh(p.shape, p.dtype)
        per_parameter = isinstance(decay, TensorData)
        decay = flat(decay) if per_parameter else np.array([decay or 0.0])
        b1, b2 = betas
        kernel = plans.adam_plan(decoupled, per_parameter, p.size)
        kernel(flat(new), flat(p), flat(g), flat(m), flat(v), decay, lr, b1, b2, eps, 1 - b1 ** t, 1 - b2 ** t)
        return new


backend = NumbaBackend()
