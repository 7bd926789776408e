"""Guards: may this call replay the step that was captured?

A compiled step is specialised to what its capture saw: the shapes and dtypes of its tensors (every
kernel, every buffer of the plan is sized for them), the very objects it updates (this model, this
optimizer), and every other argument's value (a Python number is baked into the step). `describe` writes
that down at capture; the guard check (Pieces.guard, chapter 13's fourth exercise) compares a later call
with it and names the first difference, which the compiled step prints when it captures again.
"""

import numpy as np

from course_lib.tensor import Tensor, nn, optim


def is_array(value):
    """A numpy array or anything that converts to one without copying Python objects (a torch tensor)."""
    return isinstance(value, np.ndarray) or (hasattr(value, "__array__") and hasattr(value, "shape")
                                             and not isinstance(value, (Tensor, nn.Module, optim.Optimizer)))


def describe(args):
    """One entry per argument: ("tensor", shape, dtype), ("array", shape, dtype), ("object", the object)
    for a module or an optimizer (compared by identity), or ("value", the value) for anything else."""
    entries = []
    for a in args:
        if isinstance(a, Tensor):
            entries.append(("tensor", tuple(a.shape), np.dtype(a.dtype).name))
        elif isinstance(a, (nn.Module, optim.Optimizer)):
            entries.append(("object", a))
        elif is_array(a):
            entries.append(("array", tuple(a.shape), np.asarray(a).dtype.name))
        else:
            entries.append(("value", a))
    return entries
