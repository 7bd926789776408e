"""Guards: may this call replay the step that was captured?

A compiled step is specialised to what its capture saw: the shapes and dtypes of its tensors (every
kernel, every buffer of the plan is sized for them), the very objects it updates (this model, this
optimizer), and every other argument's value (a Python number is baked into the step). `describe` writes
that down at capture; `guard` checks a later call against it and names the first difference, which the
compiled step prints when it captures again.
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


def guard(expected, args):
    """None if a call with `args` may replay a step captured with `expected` (describe's entries), else a
    sentence naming the first difference."""
    if len(args) != len(expected):
        return f"the step was captured with {len(expected)} arguments, this call passes {len(args)}"
    for k, (entry, arg) in enumerate(zip(expected, args)):
        kind = entry[0]
        if kind == "tensor" or kind == "array":
            same_kind = isinstance(arg, Tensor) if kind == "tensor" else is_array(arg)
            if not same_kind:
                return f"argument {k} is a {type(arg).__name__}, the step was captured with a {kind}"
            shape, dtype = tuple(arg.shape), np.dtype(arg.dtype).name if kind == "tensor" else np.asarray(arg).dtype.name
            if shape != entry[1]:
                return f"argument {k} has shape {shape}, the step was captured with shape {entry[1]}"
            if dtype != entry[2]:
                return f"argument {k} has dtype {dtype}, the step was captured with {entry[2]}"
        elif kind == "object":
            if arg is not entry[1]:
                return f"argument {k} is another {type(entry[1]).__name__} than the one the step was captured with"
        elif type(arg) is not type(entry[1]) or not _same(arg, entry[1]):
            return f"argument {k} is {arg!r}, the step was captured with {entry[1]!r} (a value is baked into the step)"
    return None


def _same(a, b):
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values without a plain ==
        return a is b
