"""The numpy backend: each of the four loops is one vectorized numpy call.

`TensorData.to_numpy()` turns a strided view into a numpy view of the same memory
(no copy), so numpy's own strided loops do the work; nothing here loops in Python.
Each op is the whole-array form of its scalar function in scalar_ops.py (the compiled
backends run those functions themselves); tests/test_scalar_op_codes.py checks they agree.
"""

from __future__ import annotations

import numpy as np

from course_lib.tensor.backend import Backend
from course_lib.tensor.tensor_data import TensorData

try:  # scipy's erf is vectorized; fall back to math.erf through np.vectorize
    from scipy.special import erf as _erf
except ImportError:  # pragma: no cover
    import math
    _erf = np.vectorize(math.erf, otypes=[float])

_SQRT_2 = np.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / np.sqrt(2.0 * np.pi)


def _sigmoid(x):
    # exp of a non-positive number never overflows
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)


def _gelu(x):
    return (x * 0.5 * (1.0 + _erf(x / _SQRT_2))).astype(x.dtype, copy=False)


def _gelu_grad(x):
    g = 0.5 * (1.0 + _erf(x / _SQRT_2)) + x * np.exp(-0.5 * x * x) * _INV_SQRT_2PI
    return g.astype(x.dtype, copy=False)


MAP = {
    "id": lambda x: x,
    "neg": np.negative,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "inv": np.reciprocal,
    "relu": lambda x: np.maximum(x, 0),
    "step": lambda x: (x > 0).astype(x.dtype),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "gelu": _gelu,
    "gelu_grad": _gelu_grad,
}

_COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less,
            "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal}

ZIP = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "pow": np.power,
    "max": np.maximum,
    **{name: (lambda f: lambda x, y: f(x, y).astype(np.result_type(x, y)))(f)
       for name, f in _COMPARE.items()},
}

_QUIET = {"add", "sub", "mul", "max"}  # cannot warn on finite inputs: skip errstate's cost

REDUCE = {"sum": np.add.reduce, "max": np.maximum.reduce}


def _fresh(array: np.ndarray) -> TensorData:
    """Wrap a numpy result as a contiguous TensorData (copies only if needed)."""
    array = np.asarray(array)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    if array.dtype != np.float32 and array.dtype != np.float64:
        array = array.astype(np.float64)
    return TensorData.contiguous(array.reshape(-1), array.shape)


def _write(out: TensorData, result: np.ndarray) -> TensorData:
    out.writable_numpy()[...] = result
    return out


class NumpyBackend(Backend):
    name = "numpy"

    def map(self, op, a, out=None):
        with np.errstate(all="ignore"):  # log(-1) is nan, as in torch, without a warning
            result = MAP[op](a.to_numpy())
        return _fresh(result) if out is None else _write(out, result)

    def zip(self, op, a, b, out=None):
        x, y = a.to_numpy(), b.to_numpy()
        if op in _QUIET:
            result = ZIP[op](x, y)
        else:
            with np.errstate(all="ignore"):
                result = ZIP[op](x, y)
        return _fresh(result) if out is None else _write(out, result)

    def reduce(self, op, a, dim):
        return _fresh(REDUCE[op](a.to_numpy(), axis=dim, keepdims=True))

    def matmul(self, a, b):
        return _fresh(np.matmul(a.to_numpy(), b.to_numpy()))

    def where(self, cond, a, b):
        return _fresh(np.where(cond.to_numpy() != 0, a.to_numpy(), b.to_numpy()))


backend = NumpyBackend()
