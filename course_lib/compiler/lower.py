"""Lowering: a fused group described as a `Kernel`, the form a generator writes as source.

A group (fuse.py) is nodes of the captured graph. A generator (codegen.py) needs less and more: the loop's
shape, read as `rows` of its last dim `n`; the arrays the loop reads (`loads`), each with how the element
(r, j) of the loop reads it (fuse.py's FULL, ROW, COL, ONE, or GENERAL strides); one `Step` per node,
whose operands are loads, earlier steps or constants; and the steps whose values the rest of the program
needs (`stores`, written out in that order). `expression` writes one step's formula for one element
(scalar.py's EXPR), reading load j as `a{j}[j]` (FULL, ROW) or `a{j}` (COL, ONE) and a step by its name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from course_lib.compiler.fuse import COL, FULL, GENERAL, ONE, ROW, broadcast_strides, read_kind, rows_of
from course_lib.compiler.ir import CONST
from course_lib.compiler.scalar import EXPR


@dataclass
class Load:
    """An array the kernel reads, and how element (r, j) of the loop reads it."""
    kind: str
    ref: object = None        # the Ref it comes from (None in hand-made descriptions)
    dtype: str = "float32"
    inner: int | None = None  # GENERAL: the stride along a row when it is 1 or 0 (None: another one)
    shape: tuple = ()         # GENERAL: the shape it is read over (its node's, with the loop's rows)


@dataclass
class Step:
    """One node: `name = EXPR[op]` of its operands, each ("load", j), ("temp", name) or ("const", number).
    role: "vec" (one value per element), "row" (one per row) or "reduce" (folds a vec value into a row one)."""
    name: str
    op: str
    args: tuple
    dtype: str = "float32"
    role: str = "vec"


@dataclass
class Kernel:
    """What a generator needs to write one group's loop."""
    shape: tuple                      # the loop's shape: rows = prod(shape[:-1]), n = shape[-1]
    loads: list
    steps: list
    stores: list                      # names of the steps whose values are written out, in output order
    parallel: bool = False
    group: object = field(default=None, repr=False)

    @property
    def rows(self):
        return math.prod(self.shape[:-1]) if self.shape else 1

    @property
    def n(self):
        return self.shape[-1] if self.shape else 1

    def is_pointwise(self):
        """No reduction, and every load FULL, ROW, COL or ONE: a pointwise generator's kind of kernel."""
        return all(s.role == "vec" for s in self.steps) and all(ld.kind in (FULL, ROW, COL, ONE) for ld in self.loads)


FLOAT = {"float32": "F32", "float64": "F64"}


def describe(group, needed):
    """The Kernel of a group. needed: ids of the buffers the rest of the program reads (so stored)."""
    loads, load_of, steps, name_of, stores = [], {}, [], {}, []
    shape = tuple(group.shape)
    for node in group.nodes:
        loop = tuple(node.inputs[0].shape) if node.kind == "reduce" else tuple(node.shape)
        role = "reduce" if node.kind == "reduce" else ("vec" if rows_of(loop) == rows_of(shape) else "row")
        args = []
        for ref in node.inputs:
            buf = ref.buffer
            if buf.producer in group:
                args.append(("temp", name_of[buf.producer.id]))
            elif buf.kind == CONST and buf.size == 1 and buf.dtype.kind == "f":
                args.append(("const", float(buf.value[0])))
            else:
                over = loop if role != "row" else tuple(loop[:-1]) + (shape[-1] if shape else 1,)
                kind = read_kind(ref, over)
                key = (buf.id, ref.view, kind, over if kind == GENERAL else None)
                if key not in load_of:
                    load_of[key] = len(loads)
                    inner = broadcast_strides(ref.view, over)[-1] if over and kind == GENERAL else None
                    loads.append(Load(kind, ref, buf.dtype.name, inner if inner in (0, 1) else None, over))
                args.append(("load", load_of[key]))
        op = node.op if node.kind in ("map", "zip", "reduce") else node.kind
        name = f"t{len(steps)}"
        name_of[node.id] = name
        steps.append(Step(name, op, tuple(args), node.dtype.name, role))
        if node.out.buffer.id in needed:
            stores.append(name)
    return Kernel(shape, loads, steps, stores, group=group)


def operand(arg, kernel, dtype):
    """The text of one operand inside the loop over j (cast to the step's float type when it differs)."""
    what, value = arg
    if what == "const":
        text = repr(value) if math.isfinite(value) else ("np.nan" if value != value else f"{'-' if value < 0 else ''}np.inf")
        return f"{FLOAT[dtype]}({text})"
    if what == "temp":
        return value
    load = kernel.loads[value]
    text = f"a{value}[j]" if load.kind in (FULL, ROW) or (load.kind == GENERAL and load.inner == 1) else f"a{value}"
    if load.kind == GENERAL and load.inner is None:
        text = f"a{value}[j * s{value}]"
    if load.dtype != dtype and load.dtype in FLOAT:
        text = f"{FLOAT[dtype]}({text})"
    return text


def expression(step, kernel):
    """The formula of one step for the element (r, j): `t0 + a1[j]`, `vexp(t2)`, ..."""
    dtype = step.dtype
    return EXPR[step.op].format(*[operand(a, kernel, dtype) for a in step.args], F=FLOAT[dtype])
