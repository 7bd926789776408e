"""exp(z) for z <= 0 in plain arithmetic, so that a loop of them compiles to SIMD instructions.

The fused scan takes L * D * N exponentials (4M at L = 1024, D = 256, N = 16) and little else.
Numba turns `math.exp` into a call to the C library, one value at a time: LLVM cannot vectorize a
loop around a call it cannot see into (Intel's SVML would give it vector versions; we don't have
it). So we write exp ourselves, from operations that have vector instructions:

    z = k ln2 + r,  k = round(z / ln2),  |r| <= ln2 / 2     (range reduction)
    e^z = 2^k e^r                                            (2^k: write k + bias into the exponent bits)
    e^r ~ 1 + r + r^2/2! + ... + r^m/m!                      (Taylor, m = 7 in float32, 13 in float64)

Every step is a multiply, an add, a floor or a bit operation, with no branch, so LLVM vectorizes a
loop over n that calls `exp_neg` (inlined): 8 float32 or 4 float64 exponentials per instruction.
ln2 is split in two (Cody and Waite) so that k * ln2_hi is exact and r keeps full precision.
z is clamped at the smallest normal power of two: below it e^z would be subnormal, and subnormals
make the CPU crawl. The clamp changes e^z by less than 1e-38 (float32) or 1e-307 (float64).
Accuracy: within about one unit in the last place, in float32 and float64 (see the tests).
`exp_neg` compiles on its own, without the `reassoc` flag (which would let LLVM regroup the two
halves of ln 2 and lose the precision they buy), and LLVM inlines it into the caller's loop all the same.
"""

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload


@intrinsic
def pow2(typingctx, k):
    """2.0**k for a float k holding a whole number in the normal range: the bits of k + bias, shifted
    into the exponent field (the mantissa stays 0). Compiles to a convert, an add and a shift."""
    width, mantissa, bias = {types.float32: (32, 23, 127), types.float64: (64, 52, 1023)}[k]

    def codegen(context, builder, signature, args):
        bits = ir.IntType(width)
        e = builder.fptosi(args[0], ir.IntType(32))       # float -> int32 has a vector instruction
        e = builder.sext(e, bits) if width == 64 else e
        e = builder.shl(builder.add(e, ir.Constant(bits, bias)), ir.Constant(bits, mantissa))
        return builder.bitcast(e, args[0].type)            # reinterpret the bits as a float

    return k(k), codegen


def exp_neg(z):
    """e^z for z <= 0 (Python version; compiled code gets the vectorizable one below)."""
    return math.exp(max(z, MIN_EXP[np.float64]))


# per float type: the Taylor degree, and ln 2 = hi + lo with hi short enough that k * hi is exact
LN2 = {np.float32: (7, 0.693359375, -2.12194440e-4), np.float64: (13, 6.93147180369123816490e-01, 1.90821492927058770002e-10)}
MIN_EXP = {np.float32: -126 * math.log(2), np.float64: -1022 * math.log(2)}


def _exp_neg_for(F):
    degree, hi, lo = LN2[F]
    log2e, ln2_hi, ln2_lo, zmin, half = F(1 / math.log(2)), F(hi), F(lo), F(MIN_EXP[F]), F(0.5)
    coefs = tuple(F(1 / math.factorial(j)) for j in range(degree, -1, -1))   # highest power first

    def impl(z):
        z = max(z, zmin)
        k = np.floor(z * log2e + half)       # the nearest whole number to z / ln 2
        r = (z - k * ln2_hi) - k * ln2_lo     # z - k ln 2, in [-ln2 / 2, ln2 / 2]
        p = coefs[0]
        for j in range(1, degree + 1):        # Horner: ((c0 r + c1) r + c2) r + ...
            p = p * r + coefs[j]
        return p * pow2(k)

    return impl


@overload(exp_neg, jit_options={"fastmath": {"contract", "nsz", "arcp"}})
def _exp_neg(z):
    """The compiled exp_neg, with constants of z's own type: a float64 constant would turn float32 work
    into float64 work, at half the SIMD width. `overload` picks the implementation by z's type."""
    for numba_type, F in ((types.float32, np.float32), (types.float64, np.float64)):
        if z == numba_type:
            return _exp_neg_for(F)
