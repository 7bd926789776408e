"""Chapter 07: CUDA kernels with Numba, on a GPU or on Numba's CUDA simulator.

Importing this package chooses the device first (course_lib.device.setup), because
Numba reads that choice only once, when numba.cuda is first imported.

puzzles.py and matmul.py hold the course's answers to chapter 07's exercises, each marked with the
exercise it answers: read them once your checks pass.
"""

from course_lib import device

device.setup(verbose=False)

from course_lib.cuda.launch import LaunchError, Run, blocks_for, device_name, launch  # noqa: E402, F401
