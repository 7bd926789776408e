"""The scalar ops, written once: what map, zip and reduce compute for one element.

Each op is a plain Python function of one or two floats, and its docstring is the formula the
backend interface lists (backend.py). The compiled backends compile these very functions:
the Numba backend with `njit` (fast/ops.py), the CUDA backend with `cuda.jit(device=True)`
(cuda/backend.py). The numpy backend computes the same formulas on whole arrays, and
tests/test_scalar_op_codes.py checks every backend against this table.

An op's code, the small integer a compiled kernel branches on, is its position in its table:
`MAP_CODE["exp"]`. Nothing else lists the ops in order. (Numba's disk cache of fast/ops.py's
kernels does not watch this file, so course_lib/fast/__init__.py drops them when it changes.)

Every function returns inf or nan where IEEE arithmetic does, and never raises: Python's own
float arithmetic raises on exp(1000), log(0) or 1/0, and the CUDA simulator runs this code as
Python, so those cases are written out.
"""

import math

INF = math.inf
NAN = math.nan
EXP_MAX = 709.78  # exp(x) overflows float64 above log(1.8e308) = 709.7827...
_SQRT_2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


# ---- map: one float in, one float out -----------------------------------------------------------

def identity(x):
    """x"""
    return x


def neg(x):
    """-x"""
    return -x


def exp(x):
    """exp(x)"""
    return INF if x > EXP_MAX else math.exp(x)


def log(x):
    """log(x)                    (-inf at 0, nan below)"""
    if x > 0:
        return math.log(x)
    return -INF if x == 0 else NAN


def sqrt(x):
    """sqrt(x)                   (nan below 0)"""
    return math.sqrt(x) if x >= 0 else NAN


def inv(x):
    """1 / x"""
    return 1.0 / x if x != 0 else math.copysign(INF, x)


def relu(x):
    """x if x > 0 else 0"""
    return 0.0 if x <= 0 else x  # nan stays nan


def step(x):
    """1 if x > 0 else 0          (relu's derivative)"""
    return 1.0 if x > 0 else 0.0


def sigmoid(x):
    """1 / (1 + exp(-x))        (stable for large |x|)"""
    e = math.exp(-abs(x))  # exp of a non-positive number never overflows
    return 1.0 / (1.0 + e) if x >= 0 else e / (1.0 + e)


def tanh(x):
    """tanh(x)"""
    return math.tanh(x)


def gelu(x):
    """x * 0.5 * (1 + erf(x / sqrt(2)))      (exact GELU, as torch's default)"""
    return x * 0.5 * (1.0 + math.erf(x / _SQRT_2))


def gelu_grad(x):
    """0.5 * (1 + erf(x / sqrt(2))) + x * exp(-x*x/2) / sqrt(2*pi)"""
    return 0.5 * (1.0 + math.erf(x / _SQRT_2)) + x * math.exp(-0.5 * x * x) * _INV_SQRT_2PI


# ---- zip: two floats in, one float out ----------------------------------------------------------

def add(x, y):
    """x + y"""
    return x + y


def sub(x, y):
    """x - y"""
    return x - y


def mul(x, y):
    """x * y"""
    return x * y


def div(x, y):
    """x / y                     (+-inf or nan when y is 0)"""
    return x / y if y != 0 else x * math.copysign(INF, y)  # 0 * inf is nan


def pow(x, y):
    """x ** y                    (nan for a negative x and a fractional y)"""
    if -INF < x < 0 and y % 1.0 != 0 and abs(y) != INF:
        return NAN
    if x == 0 and y < 0:
        return math.copysign(INF, x) if y % 2.0 == 1 else INF
    if x != 0 and y * math.log(abs(x)) > EXP_MAX:  # |x ** y| = exp(y * log|x|) would overflow
        return INF if x > 0 or y % 2.0 != 1 else -INF
    return x ** y


def maximum(x, y):
    """max(x, y)                 (nan if either is nan)"""
    return x if x > y or x != x else y


def eq(x, y):
    """1 if x == y else 0"""
    return 1.0 if x == y else 0.0


def ne(x, y):
    """1 if x != y else 0"""
    return 1.0 if x != y else 0.0


def lt(x, y):
    """1 if x < y else 0"""
    return 1.0 if x < y else 0.0


def le(x, y):
    """1 if x <= y else 0"""
    return 1.0 if x <= y else 0.0


def gt(x, y):
    """1 if x > y else 0"""
    return 1.0 if x > y else 0.0


def ge(x, y):
    """1 if x >= y else 0"""
    return 1.0 if x >= y else 0.0


# ---- the tables: op name -> function -----------------------------------------------------------

MAP = {"id": identity, "neg": neg, "exp": exp, "log": log, "sqrt": sqrt, "inv": inv, "relu": relu,
       "step": step, "sigmoid": sigmoid, "tanh": tanh, "gelu": gelu, "gelu_grad": gelu_grad}

ZIP = {"add": add, "sub": sub, "mul": mul, "div": div, "pow": pow, "max": maximum,
       "eq": eq, "ne": ne, "lt": lt, "le": le, "gt": gt, "ge": ge}

#: reduce: op name -> (the zip op that folds in one more element, the start value)
REDUCE = {"sum": ("add", 0.0), "max": ("max", -INF)}

MAP_CODE = {name: code for code, name in enumerate(MAP)}
ZIP_CODE = {name: code for code, name in enumerate(ZIP)}
REDUCE_CODE = {name: code for code, name in enumerate(REDUCE)}
