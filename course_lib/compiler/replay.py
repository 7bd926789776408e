"""Replay: the compiled step, one generated Python function that makes the step's calls in order.

A `Program` (built by build.py) holds the replay function, every array it reads and writes, and the
places of the step's objects it must keep in step. `run(args)` copies the arguments into the program's
input buffers, takes in any state that changed outside the step (a parameter loaded by the user), calls
the replay (no Function, no autograd walk, no backend dispatch, no allocation: numpy's calls write into
the planned views) and returns the step's result, copied. A launch that raises is named, with its group
and, for a kernel, its source.
"""

from __future__ import annotations

import numpy as np

from course_lib.compiler import kernels
from course_lib.compiler.ir import Ref, shaped
from course_lib.tensor import Tensor
from course_lib.tensor.tensor_data import TensorData


class Program:
    """A compiled step: call run(args) with the step's arguments (guards are the caller's business)."""

    def __init__(self, graph, launches, arrays, source, placement, naive_bytes, finals, installs):
        self.graph, self.launches, self.arrays, self.source = graph, launches, arrays, source
        self.placement, self.naive_bytes = placement, naive_bytes
        self.finals, self.installs = finals, installs
        self.calls = 0

    @property
    def kernels(self):
        return [launch for launch in self.launches if launch.kind == "kernel"]

    def counts(self):
        out = {}
        for launch in self.launches:
            out[launch.kind] = out.get(launch.kind, 0) + 1
        return out

    def arena_bytes(self):
        return sum(p.size * np.dtype(d).itemsize for d, p in self.placement.items())

    def run(self, args):
        for k, buf in enumerate(self.graph.inputs):        # the arguments, into the step's input buffers
            if buf is not None:
                value = args[k].data.to_numpy() if isinstance(args[k], Tensor) else np.asarray(args[k])
                np.copyto(buf.array.reshape(np.shape(value)), value, casting="unsafe")
        for slot, td, watched in self.installs:             # state changed outside the step: take it in
            now = slot.get()
            if now is not td:
                if watched and now is not None:
                    np.copyto(td.to_numpy(), now.to_numpy())
                _install(slot, td)
        with np.errstate(all="ignore"):
            try:
                self.replay()
            except Exception as e:
                raise self._failure(e) from e
        self.calls += 1
        return _result(self.graph.result, self.arrays)

    def _failure(self, error):
        """The launch that raised, with its group and (for a kernel) its source."""
        tb = error.__traceback__
        line = None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == "<compiled step>":
                line = tb.tb_lineno
            tb = tb.tb_next
        if line is None or not 2 <= line < len(self.launches) + 2:
            return error
        launch = self.launches[line - 2]
        text = f"\n{kernels.numbered(launch.source)}" if launch.source else ""
        return kernels.KernelError(f"launch {line - 2} of the compiled step failed: {type(error).__name__}: {error}\n"
                                   f"  group: {launch.describe()}\n  call: {launch.text}{text}")



def _install(slot, td):
    """Make the place hold `td` again (the compiled step's memory)."""
    if slot.how == "data":
        slot.owner.data = td
    elif slot.how == "grad":
        slot.owner.grad = Tensor._wrap(td)
    elif slot.how == "item":
        slot.owner[slot.key] = Tensor._wrap(td)
    else:
        setattr(slot.owner, slot.key, Tensor._wrap(td))



def _result(template, arrays):
    if isinstance(template, Ref):
        view = shaped(arrays[template.buffer.id], template.view)
        return Tensor._wrap(TensorData.contiguous(np.array(view).reshape(-1), tuple(template.view.shape)))
    if isinstance(template, (tuple, list)):
        return type(template)(_result(t, arrays) for t in template)
    if isinstance(template, dict):
        return {k: _result(v, arrays) for k, v in template.items()}
    return template
