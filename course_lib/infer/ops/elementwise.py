"""Elementwise kernels: arithmetic, activations, comparisons and logic. Numpy broadcasting is ONNX's."""

import numpy as np

from ..registry import Unsupported, register

try:
    from scipy.special import erf as _erf64
except ImportError:  # numpy only: math.erf element by element (slower)
    import math
    _erf64 = np.vectorize(math.erf, otypes=[np.float64])


def _erf(x):
    """erf: exact (scipy) in float64; in float32 and float16 Abramowitz & Stegun 7.1.26, whose error
    (below 1.5e-7) is at float32's rounding level. It works on chunks that stay in the CPU cache."""
    if x.dtype == np.float64:
        return _erf64(x)
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.empty_like(flat)
    for k in range(0, flat.size, 16384):
        _erf_chunk(flat[k:k + 16384], out[k:k + 16384])
    return out.reshape(x.shape).astype(x.dtype, copy=False)


def _erf_chunk(x, out):
    a = np.abs(x)
    t = np.float32(0.3275911) * a
    t += 1
    np.reciprocal(t, out=t)
    np.multiply(t, np.float32(1.061405429), out=out)
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        out += np.float32(c)
        out *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    out *= a                       # (a1 t + ... + a5 t^5) exp(-x^2)
    np.subtract(1, out, out=out)   # erf(|x|)
    np.copysign(out, x, out=out)


def _same(fn):
    """Wrap a float function so the result keeps the input dtype."""
    return lambda x: np.asarray(fn(x)).astype(x.dtype, copy=False)


# ---- binary arithmetic ----------------------------------------------------------------

@register("Add", since=7)
def add(a, b):
    return a + b


@register("Sub", since=7)
def sub(a, b):
    return a - b


@register("Mul", since=7)
def mul(a, b):
    return a * b


@register("Div", since=7)
def div(a, b):
    if np.issubdtype(a.dtype, np.integer):  # integer division truncates toward zero
        q = np.abs(a) // np.abs(b)
        return np.where((a < 0) != (b < 0), -q, q).astype(a.dtype) if np.issubdtype(a.dtype, np.signedinteger) else a // b
    return a / b


@register("Pow", since=7)
def pow_(a, b):
    if np.issubdtype(a.dtype, np.integer):
        return np.power(a.astype(np.float64), b).astype(a.dtype)
    return np.power(a, b.astype(a.dtype))


@register("Mod", since=10)
def mod(a, b, *, fmod=0):
    """fmod=1: the remainder takes the sign of a (C's fmod); fmod=0: the sign of b (Python's %)."""
    return np.fmod(a, b) if fmod else np.mod(a, b)


def _variadic(fn):
    def kernel(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out
    return kernel


register("Max", since=8)(_variadic(np.maximum))
register("Min", since=8)(_variadic(np.minimum))
register("Sum", since=8)(_variadic(np.add))


@register("Mean", since=8)
def mean(*xs):
    return (_variadic(np.add)(*xs) / len(xs)).astype(xs[0].dtype)


# ---- unary math -----------------------------------------------------------------------

for _name, _fn in {"Sqrt": np.sqrt, "Exp": np.exp, "Log": np.log, "Neg": np.negative, "Abs": np.abs,
                   "Tanh": np.tanh, "Reciprocal": np.reciprocal, "Floor": np.floor, "Ceil": np.ceil,
                   "Round": np.round, "Sign": np.sign, "Sin": np.sin, "Cos": np.cos, "Tan": np.tan,
                   "Asin": np.arcsin, "Acos": np.arccos, "Atan": np.arctan, "Sinh": np.sinh, "Cosh": np.cosh,
                   "Asinh": np.arcsinh, "Acosh": np.arccosh, "Atanh": np.arctanh}.items():
    register(_name, since=6)(_same(_fn))

register("Erf", since=9)(_same(_erf))
register("IsNaN", since=9)(np.isnan)


@register("IsInf", since=10)
def isinf(x, *, detect_negative=1, detect_positive=1):
    return np.isinf(x) & (((x < 0) & bool(detect_negative)) | ((x > 0) & bool(detect_positive)))


# ---- activations ----------------------------------------------------------------------

@register("Relu", since=6)
def relu(x):
    return np.maximum(x, x.dtype.type(0))


@register("Sigmoid", since=6)
def sigmoid(x):
    return (1 / (1 + np.exp(-x))).astype(x.dtype)


@register("LeakyRelu", since=6)
def leaky_relu(x, *, alpha=0.01):
    return np.where(x >= 0, x, x * x.dtype.type(alpha))


@register("PRelu", since=9)
def prelu(x, slope):
    return np.where(x >= 0, x, x * slope).astype(x.dtype)


@register("Elu", since=6)
def elu(x, *, alpha=1.0):
    return np.where(x >= 0, x, alpha * (np.exp(x) - 1)).astype(x.dtype)


@register("Selu", since=6)
def selu(x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return (gamma * np.where(x > 0, x, alpha * (np.exp(x) - 1))).astype(x.dtype)


@register("Celu", since=12)
def celu(x, *, alpha=1.0):
    return (np.maximum(x, 0) + np.minimum(0, alpha * (np.exp(x / alpha) - 1))).astype(x.dtype)


@register("HardSigmoid", since=6)
def hard_sigmoid(x, *, alpha=0.2, beta=0.5):
    return np.clip(alpha * x + beta, 0, 1).astype(x.dtype)


@register("HardSwish", since=14)
def hard_swish(x):
    return (x * np.clip(x / 6 + 0.5, 0, 1)).astype(x.dtype)


@register("Softplus", since=1)
def softplus(x):
    return np.logaddexp(0, x).astype(x.dtype)


@register("Softsign", since=1)
def softsign(x):
    return (x / (1 + np.abs(x))).astype(x.dtype)


@register("ThresholdedRelu", since=10)
def thresholded_relu(x, *, alpha=1.0):
    return np.where(x > alpha, x, 0).astype(x.dtype)


@register("Shrink", since=9)
def shrink(x, *, bias=0.0, lambd=0.5):
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0)).astype(x.dtype)


@register("Gelu", since=20)
def gelu(x, *, approximate="none"):
    if approximate == "tanh":
        # x * x * x, not x ** 3: on float32, numpy's power calls pow once per element, far slower than two products
        y = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * (x * x * x))))
    else:
        y = 0.5 * x * (1 + _erf(x / np.sqrt(2)))
    return y.astype(x.dtype)


@register("Mish", since=18)
def mish(x):
    return (x * np.tanh(np.logaddexp(0, x))).astype(x.dtype)


@register("Clip", since=11)
def clip(x, lo=None, hi=None):
    if lo is not None:
        x = np.maximum(x, lo)
    if hi is not None:
        x = np.minimum(x, hi)
    return x


@register("Clip", since=6)
def clip_6(x, *, min=-3.4028234663852886e38, max=3.4028234663852886e38):
    return np.clip(x, min, max).astype(x.dtype)


# ---- comparisons and logic ------------------------------------------------------------

for _name, _fn in {"Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
                   "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or,
                   "Xor": np.logical_xor, "BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or,
                   "BitwiseXor": np.bitwise_xor}.items():
    register(_name, since=7)(_fn)

register("Not", since=1)(np.logical_not)
register("BitwiseNot", since=18)(np.bitwise_not)


@register("BitShift", since=11)
def bit_shift(x, y, *, direction):
    return np.left_shift(x, y) if direction == "LEFT" else np.right_shift(x, y)


@register("Where", since=9)
def where(cond, a, b):
    return np.where(cond, a, b)


# ---- identity, dropout, casts ---------------------------------------------------------

@register("Identity", since=1)
def identity(x):
    return x


@register("Dropout", since=12)
def dropout(x, ratio=None, training_mode=None, *, seed=None):
    """At inference Dropout is the identity, and its mask is all True."""
    if training_mode is not None and bool(training_mode) and (ratio is None or float(ratio) != 0):
        raise Unsupported("Dropout in training mode is random")
    return x, np.ones(x.shape, dtype=bool)


@register("Dropout", since=7)
def dropout_7(x, *, ratio=0.5):
    return x, np.ones(x.shape, dtype=bool)


NUMPY_TYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
               9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


def _cast(x, dtype):
    plain = {np.dtype(t) for t in NUMPY_TYPES.values()}
    if x.dtype not in plain or np.dtype(dtype) not in plain:
        raise Unsupported(f"Cast between {x.dtype} and {np.dtype(dtype)}")
    return x.astype(dtype)


@register("Cast", since=6)
def cast(x, *, to, saturate=1, round_mode=None):
    if to not in NUMPY_TYPES:
        raise Unsupported(f"Cast to ONNX type {to} (no numpy dtype)")
    return _cast(x, NUMPY_TYPES[to])


@register("CastLike", since=15)
def cast_like(x, like, *, saturate=1, round_mode=None):
    return _cast(x, like.dtype)
