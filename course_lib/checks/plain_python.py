"""A learner's kernel run as plain Python, with instruments in place of the things it calls.

Numba compiles a Python function; its `py_func` is that function, and runs as Python too, only slower.
Run so, on small inputs, the kernel's every step is visible to the check, the same on any machine and any
number of threads:
- numpy's floating-point checks see each product (`np.errstate(over="raise")` makes an overflow raise on
  the line that computed it);
- anything the kernel reaches by name (numpy, one of its functions, a module) can be swapped for an
  instrument that notes how it was used.

    run = AsPython(swaps={np: counting_numpy})
    run.function(your_kernel, top=True)(*args)
"""

import traceback
import types


class AsPython:
    """Turns a kernel back into Python: the Numba functions it calls (by name, through a module or from a
    closure) and the Python functions of its own module come back as Python too, each with `swaps`
    ({object: replacement}, by identity) applied to what it reaches by name."""

    def __init__(self, swaps=None):
        self.swaps = {id(k): v for k, v in (swaps or {}).items()}
        self.done, self.home = {}, None

    def function(self, fn, top=False):
        """fn's Python copy; anything that is neither a Numba function nor a Python function of the top
        function's module comes back as it is."""
        mine = isinstance(fn, types.FunctionType) and (top or fn.__globals__ is self.home)
        py = getattr(fn, "py_func", fn if mine else None)
        if not isinstance(py, types.FunctionType):
            return fn
        if self.home is None:
            self.home = py.__globals__
        if py not in self.done:
            scope, cells = dict(py.__globals__), tuple(types.CellType() for _ in py.__closure__ or ())
            self.done[py] = types.FunctionType(py.__code__, scope, py.__name__, py.__defaults__, cells or None)
            for name in _global_names(py.__code__) & scope.keys():
                scope[name] = self.value(scope[name])
            for cell, theirs in zip(cells, py.__closure__ or ()):
                cell.cell_contents = self.value(theirs.cell_contents)
        return self.done[py]

    def value(self, value):
        """What the Python copy sees in place of `value`."""
        if id(value) in self.swaps:
            return self.swaps[id(value)]
        if isinstance(value, types.ModuleType) and value.__name__.split(".")[0] not in ("numba", "math"):
            return _Module(value, self)
        return self.function(value)


def _global_names(code):
    """The global names a function's code (and the code of the functions it defines) looks up."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


class _Module:
    """A module seen through AsPython: each attribute comes out as AsPython.value makes it."""

    def __init__(self, module, as_python):
        self._module, self._as_python = module, as_python

    def __getattr__(self, name):
        return self._as_python.value(getattr(self._module, name))


def your_line(error, checks_file):
    """`source` (in name) for the innermost frame of the learner's code in an exception's traceback (frames
    of numpy and of the check's own file `checks_file` left out)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if "numpy" not in f.filename.replace("\\", "/").split("/") and not f.filename.endswith(checks_file)]
    if not frames:
        return "in your kernel"
    f = frames[-1]
    return f"at `{f.line.strip()}` (in {f.name})" if f.line else f"in {f.name}"


def caller_line(depth=2):
    """The source line `depth` frames up the stack: the learner's line that called an instrument."""
    line = traceback.extract_stack(limit=depth + 1)[0].line
    return line.strip() if line else "?"
