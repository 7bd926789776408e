"""Broadcasting: the shape two operands broadcast to, and the index each one reads.

Shapes are aligned on the right; in each position the sizes match or one of them is 1 (a missing
leading dim counts as 1), and a dim of size 1 is read at index 0 whatever the output's index. These
are the course's answers to exercise 02.1 and to the index rule of exercise 02.2: read them once your
checks pass.
"""

from __future__ import annotations

from course_lib.tensor.tensor_data import ShapeError


def shape_broadcast(a: tuple, b: tuple, op: str = "broadcast") -> tuple:
    """The course's answer to exercise 02.1 (`broadcast_shape`): read it once your check passes.

    The shape two operands broadcast to (numpy/PyTorch rules), or a ShapeError."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and x != 1 and y != 1:
            raise ShapeError(
                f"{op}: shapes {tuple(a)} and {tuple(b)} do not broadcast "
                f"(dim {-i}: {x} vs {y}; sizes must match or one must be 1)")
        out.append(max(x, y) if min(x, y) != 0 else 0)
    return tuple(reversed(out))


def broadcast_index(big_index, big_shape, shape, out_index):
    """The course's answer to exercise 02.2 (`strided_zip`): read it once your check passes.

    Index into the broadcast shape `big_shape` -> index into the smaller `shape`.

    Dimensions are aligned on the right; a dimension of size 1 always reads index 0.
    """
    extra = len(big_shape) - len(shape)
    for i in range(len(shape)):
        out_index[i] = 0 if shape[i] == 1 else big_index[i + extra]
