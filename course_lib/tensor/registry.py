"""The op registry: which Function each op applies, and which order `backward` walks the graph in.

tensor.py and nn.py apply every op through `OPS` (`OPS.Mul.apply(a, b)`), never through a class of
functions.py directly. By default `OPS.Mul` is `functions.Mul` and `OPS.topological_order` is
autodiff's. Inside a `use_ops` block, other classes take their places, by name:

    with use_ops(Softmax=MySoftmax, topological_order=my_order):
        loss = model(x, y)       # every .softmax() applies MySoftmax
        loss.backward()          # and backward walks the graph in my_order

This is the library's declared plug-in point for ops, as `use_backend` is for kernels: chapter 12 runs
the GPT on the learner's Functions through it (course_lib/yours/ch12_capstone.py). Blocks nest; the
innermost wins; leaving a block puts back what was there before it.
"""

import contextlib

from course_lib.tensor import autodiff, functions

_MISSING = object()


class OpTable:
    """functions.py's ops by name (and autodiff's topological_order), or those a use_ops block put in.

    A block writes its classes into this object's own attributes, which Python finds first; a name no
    block has set falls through to __getattr__, which reads the library's module."""

    def __getattr__(self, name):
        if name == "topological_order":
            return autodiff.topological_order
        try:
            return getattr(functions, name)
        except AttributeError:
            raise AttributeError(f"the op registry has no op {name!r}; the ops are the Functions of "
                                 f"course_lib/tensor/functions.py") from None

    def __repr__(self):
        mine = ", ".join(f"{name}={value.__module__}.{value.__qualname__}" for name, value in vars(self).items())
        return f"<ops: functions.py's{', except ' + mine if mine else ''}>"


OPS = OpTable()


def _known(name):
    return name == "topological_order" or isinstance(getattr(functions, name, None), type)


@contextlib.contextmanager
def use_ops(**ops):
    """Inside the block, OPS.<name> is the given Function class (or order function) for each name given."""
    unknown = [name for name in ops if not _known(name)]
    if unknown:
        raise KeyError(f"use_ops: no op named {', '.join(unknown)}; the names are those of the Functions in "
                       f"course_lib/tensor/functions.py (Mul, Softmax, LayerNorm, ...) and topological_order")
    saved = {name: vars(OPS).get(name, _MISSING) for name in ops}
    vars(OPS).update(ops)
    try:
        yield OPS
    finally:
        for name, before in saved.items():
            if before is _MISSING:
                vars(OPS).pop(name, None)
            else:
                vars(OPS)[name] = before
