"""The captured program: buffers, views into them, and the nodes that read and write them.

Chapter 03's graph holds symbolic values, built before anything runs. A compiler that captures an
eager step sees something else: real calls of the backend on real memory. A tensor is a view
(shape, strides, offset) of a flat storage, and many views share one storage (`x.T`, a reshape, a
slice), so the program is written in terms of the storages, here called buffers, and the views the
nodes read them through. Each buffer says where its values come from:

    input    an argument of the step (copied into a buffer of the compiled step at each call)
    state    what the step's objects hold when it starts: parameters, gradients, the optimizer's moments
    const    values made outside any op and the same at every call: a Python number, a mask
    temp     written by one node of the step
    scratch  zeros made by the library and then filled by the nodes that write into views of it

A node is one backend call (map, zip, where, reduce, matmul), a copy into a view of a scratch buffer,
or an op the compiler leaves to Python (an island). `Graph.text()` prints the program.

Why not chapter 03's `Graph`: its nodes are symbolic float64 values, built by calling ops on placeholders,
their shapes inferred as they are defined. A captured step is made of calls that already happened, on
memory seen through views, in float32 or float64, with writes into scratch memory and state to read and
write back; it needs its own nodes. What carries over is chapter 03's way of drawing a graph
(`course_lib.viz.draw_graph`, see draw.py) and chapter 09's lifetimes for the memory plan (plan.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from course_lib.tensor.tensor_data import contiguous_strides

INPUT, STATE, CONST, TEMP, SCRATCH = "input", "state", "const", "temp", "scratch"


@dataclass(frozen=True)
class View:
    """How a node reads (or writes) a buffer: element index -> offset + sum(index * strides)."""
    shape: tuple
    strides: tuple
    offset: int = 0

    @staticmethod
    def of(td):
        return View(tuple(td.shape), tuple(td.strides), int(td.offset))

    @staticmethod
    def natural(shape):
        return View(tuple(shape), contiguous_strides(shape), 0)

    @property
    def size(self):
        return math.prod(self.shape)

    def is_natural(self):
        """Row-major with no gaps, from the buffer's start: what a fresh output looks like."""
        expected = contiguous_strides(self.shape)
        return self.offset == 0 and all(s == e for s, e, n in zip(self.strides, expected, self.shape) if n != 1)

    def __str__(self):
        plain = self.is_natural()
        return str(self.shape) if plain else f"{self.shape} strides {self.strides} offset {self.offset}"


class Buffer:
    """One flat block of memory of the step (a storage), and where its values come from."""

    def __init__(self, id, kind, array, name="", origin=None):
        self.id, self.kind, self.name, self.origin = id, kind, name, origin
        self.dtype, self.size = array.dtype, array.size
        self.array = array          # the memory the capture ran on (kept alive, so its id stays unique)
        self.value = None           # const: the values, copied when first seen
        self.producer = None        # temp: the node that writes it; scratch: the last node that writes into it

    def __repr__(self):
        return f"<{self.kind} {self.label()} {self.dtype} x{self.size}>"

    def label(self):
        return self.name or f"{self.kind[0]}{self.id}"


@dataclass(frozen=True)
class Ref:
    """A node's operand: a buffer seen through a view."""
    buffer: Buffer
    view: View

    @property
    def shape(self):
        return self.view.shape

    @property
    def dtype(self):
        return self.buffer.dtype

    def __str__(self):
        view = "" if self.view.is_natural() and self.view.size == self.buffer.size else f"[{self.view}]"
        return f"{self.buffer.label()}{view}"


@dataclass(eq=False)
class Node:
    """One operation of the captured step.

    kind: "map", "zip", "where", "reduce", "matmul" (the backend's calls), "fill" (zeros into a scratch
    buffer), "one_hot" (cross-entropy's targets, from an integer input) or "island" (run by Python).
    A map or zip with attrs["into"] writes into a view of a scratch buffer instead of a fresh one."""
    id: int
    kind: str
    op: str
    inputs: list
    out: Ref
    attrs: dict = field(default_factory=dict)
    scope: str = ""       # the library op it ran inside: "Softmax.forward", "LayerNorm.backward", ...
    where: tuple = ()     # (file, line, function) of the code that asked for it
    start: int = -1       # set by fusion: the id of the first node of its group, where the group runs

    @property
    def shape(self):
        return self.out.view.shape

    @property
    def dtype(self):
        return self.out.buffer.dtype

    def label(self):
        extra = "".join(f" {k}={v}" for k, v in self.attrs.items() if k in ("dim", "classes"))
        return f"{self.kind} {self.op}{extra}" if self.op else self.kind

    def __repr__(self):
        args = ", ".join(str(r) for r in self.inputs)
        into = "into " if self.attrs.get("into") else ""
        return f"n{self.id}: {into}{self.out} = {self.label()}({args})  {self.dtype} {self.shape}"


@dataclass
class Slot:
    """A place of the step's objects that holds a tensor (a parameter's data, its grad, an optimizer's
    moment): what it held when the step started and when it ended."""
    owner: object
    key: str
    how: str          # "data" (a Tensor's .data), "grad" (a Tensor's .grad), "item" (a dict entry), "attr"
    name: str
    before: Ref | None = None
    after: Ref | None = None

    def get(self):
        """The TensorData the place holds now (None if it holds nothing)."""
        if self.how == "data":
            return self.owner.data
        value = self.owner.grad if self.how == "grad" else (
            self.owner.get(self.key) if self.how == "item" else getattr(self.owner, self.key, None))
        return None if value is None else value.data


@dataclass
class Graph:
    """The captured step: its nodes in the order they ran, its buffers, and its boundary."""
    nodes: list
    buffers: list
    inputs: list                                  # per argument of the step: its input Buffer, or None
    slots: list                                   # Slot per place of state
    result: object = None                         # the step's return value, with Refs in place of tensors
    breaks: list = field(default_factory=list)    # (where, what) of each value read by Python mid-step

    def text(self, limit=None):
        lines = [repr(n) for n in self.nodes[:limit]]
        if limit is not None and len(self.nodes) > limit:
            lines.append(f"... {len(self.nodes) - limit} more")
        return "\n".join(lines)

    def counts(self):
        """How many nodes of each kind: {"zip": 41, "matmul": 6, ...}."""
        out = {}
        for n in self.nodes:
            out[n.kind] = out.get(n.kind, 0) + 1
        return out


def shaped(array, view):
    """The view of a flat array as a numpy array (no copy)."""
    item = array.itemsize
    return np.lib.stride_tricks.as_strided(array[view.offset:], view.shape, tuple(s * item for s in view.strides))
