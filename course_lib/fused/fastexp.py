"""Moved to course_lib.simd.fastexp. This name stays so that code saved before the move (a learner's
work/yours/ch10.py, Numba's cached machine code) still imports; new code imports course_lib.simd.fastexp."""

from course_lib.simd.fastexp import LN2, MIN_EXP, exp_neg, pow2  # noqa: F401
