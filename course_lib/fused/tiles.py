"""Moved to course_lib.simd.tiles. This name stays so that code saved before the move (a learner's
work/yours/ch10.py, Numba's cached machine code) still imports; new code imports course_lib.simd.tiles."""

from course_lib.simd.tiles import FASTMATH, matmul_bt, row_max, transpose  # noqa: F401
