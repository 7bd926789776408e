"""One element of each op, as a generated kernel writes it: `EXPR[op].format(*operands, F=dtype)`.

Each formula is the numpy backend's (tensor/numpy_backend.py) for one element, computed in the element's
own float type F (F32 or F64): a float64 constant in float32 code would turn the work into float64 work,
with another rounding than the eager step's and half the SIMD width. So constants are written F(...),
and the helpers below are `overload`s that pick their constants by the argument's type, as
simd/fastexp.py does.

exp goes through fastexp's `exp_neg` (e^z for z <= 0, in plain arithmetic that LLVM vectorizes): Numba
calls the C library's exp one value at a time, and a loop around such a call stays scalar (8 to 16 times
slower than numpy's SIMD exp here). sigmoid needs only e^-|x|; exp of a positive number takes 1 / e^-x.
log, tanh, sqrt and erf are the C library's (sqrt is one instruction anyway; the others are rare in a
training step: a log per row of the loss).
"""

import math

import numpy as np
from numba import types
from numba.extending import overload

from course_lib.simd.fastexp import MIN_EXP, exp_neg

F32, F64 = np.float32, np.float64

#: op -> one element's expression; {0}, {1}, {2} are the operands, {F} the element's float type
EXPR = {
    # map
    "id": "{0}",
    "neg": "-{0}",
    "exp": "vexp({0})",
    "log": "np.log({0})",
    "sqrt": "np.sqrt({0})",
    "inv": "{F}(1.0) / {0}",
    "relu": "vrelu({0})",
    "step": "{F}({0} > {F}(0.0))",
    "sigmoid": "vsigmoid({0})",
    "tanh": "np.tanh({0})",
    "gelu": "vgelu({0})",
    "gelu_grad": "vgelu_grad({0})",
    # zip
    "add": "{0} + {1}",
    "sub": "{0} - {1}",
    "mul": "{0} * {1}",
    "div": "{0} / {1}",
    "pow": "{0} ** {1}",
    "max": "vmax({0}, {1})",
    "eq": "{F}({0} == {1})",
    "ne": "{F}({0} != {1})",
    "lt": "{F}({0} < {1})",
    "le": "{F}({0} <= {1})",
    "gt": "{F}({0} > {1})",
    "ge": "{F}({0} >= {1})",
    # where(cond, a, b), and one_hot(index) at column j
    "where": "({1} if {0} != {F}(0.0) else {2})",
    "one_hot": "{F}({0} == j)",
}

#: reduce op -> (the start value, the fold of one more element x into acc). The max is Numba's, which LLVM
#: turns into SIMD max instructions; a row with a nan then need not give nan as its max, but the softmax
#: or log-softmax around it still gives nan for that row, through the x - max that follows.
REDUCE = {"sum": ("{F}(0.0)", "{acc} + {x}"), "max": ("{F}(-np.inf)", "max({acc}, {x})")}


# ---- Python versions (what the overloads below compile to, one value at a time) ------------------------

def vexp(x):
    return math.exp(x)


def vsigmoid(x):
    e = math.exp(-abs(x))
    return 1.0 / (1.0 + e) if x >= 0 else e / (1.0 + e)


def vrelu(x):
    return x if x > 0 or x != x else 0.0


def vmax(x, y):
    return x if x > y or x != x else y


def vgelu(x):
    return x * 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def vgelu_grad(x):
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0))) + x * math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _float_type(x):
    return {types.float32: np.float32, types.float64: np.float64}.get(x)


@overload(vexp)
def _vexp(x):
    F = _float_type(x)
    if F is None:
        return None
    low, high = F(MIN_EXP[F]), F(np.log(np.finfo(F).max))

    def impl(x):
        e = exp_neg(-abs(x))                   # e^-|x|, vectorizable
        y = e if x <= 0 else F(1.0) / e        # e^x = 1 / e^-x above 0
        y = F(0.0) if x < low else y           # -inf and the subnormal range: 0, as a mask wants
        y = F(np.inf) if x > high else y
        return x if x != x else y
    return impl


@overload(vsigmoid)
def _vsigmoid(x):
    F = _float_type(x)
    if F is None:
        return None

    def impl(x):
        e = exp_neg(-abs(x))
        one = F(1.0)
        return one / (one + e) if x >= F(0.0) else e / (one + e)
    return impl


@overload(vrelu)
def _vrelu(x):
    F = _float_type(x)
    if F is None:
        return None
    return lambda x: x if (x > F(0.0) or x != x) else F(0.0)


@overload(vmax)
def _vmax(x, y):
    return lambda x, y: x if (x > y or x != x) else y


@overload(vgelu)
def _vgelu(x):
    F = _float_type(x)
    if F is None:
        return None
    half, root2 = F(0.5), F(math.sqrt(2.0))
    return lambda x: x * half * (F(1.0) + F(math.erf(x / root2)))


@overload(vgelu_grad)
def _vgelu_grad(x):
    F = _float_type(x)
    if F is None:
        return None
    half, root2, inv = F(0.5), F(math.sqrt(2.0)), F(1.0 / math.sqrt(2.0 * math.pi))
    return lambda x: half * (F(1.0) + F(math.erf(x / root2))) + x * np.exp(-half * x * x) * inv
