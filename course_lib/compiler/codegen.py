"""Code generation: the source of one loop per fused group.

A group is first described as a `Kernel` (`describe`): the loop's shape, read as `rows` of its last dim
`n`; the arrays it reads (`loads`, each with how the element (r, j) reads it: FULL, ROW, COL, ONE, or
GENERAL strides); one `Step` per node, whose operands are loads, earlier steps or constants; and the
steps whose values the rest of the program needs (`stores`). Then a generator writes it as Python text:

    def kernel(out0, in0, in1, R, n):
        for r in prange(R):                  # rows, spread over the threads
            o0 = out0[r * n:(r + 1) * n]
            a0 = in0[r * n:(r + 1) * n]      # FULL: this row of a tensor of the loop's shape
            a1 = in1[:n]                     # ROW: the same row for all rows (a bias)
            for j in range(n):
                t0 = a0[j] + a1[j]
                t1 = vsigmoid(t0)
                o0[j] = t0 * t1

Each row works on slices indexed by the loop counter alone, so Numba drops its wraparound tests and
LLVM vectorizes the inner loop (fast/flat.py found the same). `pointwise_source` writes groups without a
reduction whose loads are FULL, ROW, COL or ONE; `rows_source` writes the rest: several passes over
each row, one per reduction they wait for (softmax: the max, then the sum, then the division), and
loads with any strides. A value needed in a later pass than its own is stored there if the program
needs it anyway, else computed again (an exp is cheaper than a round trip through memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from course_lib.compiler.fuse import COL, FULL, GENERAL, ONE, ROW, broadcast_strides, read_kind, rows_of
from course_lib.compiler.ir import CONST
from course_lib.compiler.scalar import EXPR, REDUCE


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
        """No reduction, and every load FULL, ROW, COL or ONE: what `pointwise_source` writes."""
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


# ---- writing the source ---------------------------------------------------------------------------------

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
    dtype = step.dtype
    return EXPR[step.op].format(*[operand(a, kernel, dtype) for a in step.args], F=FLOAT[dtype])


def pointwise_source(kernel):
    """The loop of a group without reductions whose loads are FULL, ROW, COL or ONE."""
    outs = [f"out{k}" for k in range(len(kernel.stores))]
    ins = [f"in{j}" for j in range(len(kernel.loads))]
    lines = [f"def kernel({', '.join(outs + ins + ['R', 'n'])}):",
             "    for r in prange(R):"]
    for k in range(len(outs)):
        lines.append(f"        o{k} = out{k}[r * n:(r + 1) * n]")
    for j, load in enumerate(kernel.loads):
        index = {FULL: "r * n:(r + 1) * n", ROW: ":n", COL: "r", ONE: "0"}[load.kind]
        lines.append(f"        a{j} = in{j}[{index}]")
    lines.append("        for j in range(n):")
    for step in kernel.steps:
        lines.append(f"            {step.name} = {expression(step, kernel)}")
    for k, name in enumerate(kernel.stores):
        lines.append(f"            o{k}[j] = {name}")
    return "\n".join(lines)


def stage_of(kernel):
    """The pass over the row each step runs in: a vec step runs in the first pass after every reduction
    it waits for; a reduction folds in the pass of its input; a row step runs after the pass that
    finishes the last reduction it needs (its `stage` is the pass whose results it can use)."""
    ready, stage = {}, {}
    for step in kernel.steps:
        deps = [ready[a[1]] for a in step.args if a[0] == "temp"]
        s = max(deps, default=0)
        stage[step.name] = s
        ready[step.name] = s + 1 if step.role == "reduce" else s
    return stage


BLOCK = 512   # elements per block of blocked_source


def blocked_source(kernel):
    """The loop of a pointwise kernel that writes over memory it reads (an optimizer's update of its state,
    in place): each block of a row is computed into small arrays of the kernel's own, then copied out, so
    that LLVM sees no overlap between what the inner loop reads and writes, and vectorizes it."""
    outs = [f"out{k}" for k in range(len(kernel.stores))]
    ins = [f"in{j}" for j in range(len(kernel.loads))]
    by_name = {s.name: s for s in kernel.steps}
    lines = [f"def kernel({', '.join(outs + ins + ['R', 'n'])}):", "    for r in prange(R):"]
    for k, name in enumerate(kernel.stores):
        lines.append(f"        b{k} = np.empty({BLOCK}, {FLOAT[by_name[name].dtype]})")
    lines += [f"        for lo in range(0, n, {BLOCK}):", f"            m = min({BLOCK}, n - lo)",
              "            base = r * n + lo"]
    for j, load in enumerate(kernel.loads):
        index = {FULL: "base:base + m", ROW: "lo:lo + m", COL: "r", ONE: "0"}[load.kind]
        lines.append(f"            a{j} = in{j}[{index}]")
    lines.append("            for j in range(m):")
    for step in kernel.steps:
        lines.append(f"                {step.name} = {expression(step, kernel)}")
    for k, name in enumerate(kernel.stores):
        lines.append(f"                b{k}[j] = {name}")
    for k in range(len(outs)):
        lines.append(f"            out{k}[base:base + m] = b{k}[:m]")
    return "\n".join(lines)


EXPENSIVE = {"exp", "log", "sigmoid", "tanh", "gelu", "gelu_grad", "sqrt", "div", "pow"}


def rows_source(kernel):
    """The loop of any group: one pass over each row per reduction the steps wait for, then the stores.

    A vec value that a later pass reads again is read back from the output it is stored in; if it is not
    an output, it is computed again, unless it is dear (an exp, a division) and an output of a later pass
    is free to hold it until then (softmax parks exp(x - max) in its output, then divides it in place)."""
    outs = [f"out{k}" for k in range(len(kernel.stores))]
    ins = [f"in{j}" for j in range(len(kernel.loads))]
    extra = []
    for j, ld in enumerate(kernel.loads):
        if ld.kind == GENERAL:
            extra += [f"rb{j}"] + ([f"s{j}"] if ld.inner is None else [])
    lines = [f"def kernel({', '.join(outs + ins + ['R', 'n'] + extra)}):", "    for r in prange(R):"]
    store_of = {name: k for k, name in enumerate(kernel.stores)}
    by_name = {s.name: s for s in kernel.steps}
    for k, name in enumerate(kernel.stores):
        index = "r * n:(r + 1) * n" if by_name[name].role == "vec" else "r:r + 1"
        lines.append(f"        o{k} = out{k}[{index}]")
    for j, load in enumerate(kernel.loads):
        if load.kind == GENERAL:  # where row r starts (rb: worked out once, when the program is built)
            start = f"rb{j}[r]"
            if load.inner == 1:
                lines.append(f"        a{j} = in{j}[{start}:{start} + n]")
            elif load.inner == 0:
                lines.append(f"        a{j} = in{j}[{start}]")
            else:
                lines.append(f"        a{j} = in{j}[{start}:]")
            continue
        index = {FULL: "r * n:(r + 1) * n", ROW: ":n", COL: "r", ONE: "0"}[load.kind]
        lines.append(f"        a{j} = in{j}[{index}]")
    stage = stage_of(kernel)
    passes = max([stage[s.name] for s in kernel.steps if s.role != "row"], default=0) + 1
    park = _parking(kernel, stage, store_of)
    slot_of = dict(store_of, **park)     # where a value computed in an earlier pass can be read back
    done = set()     # row values and finished reductions: plain names from now on
    stored = set()   # vec values written out (or parked) in an earlier pass
    for p in range(passes):
        for step in kernel.steps:  # the row values this pass can use
            if step.role == "row" and stage[step.name] == p and step.name not in done:
                lines.append(f"        {step.name} = {expression(step, kernel)}")
                done.add(step.name)
        here = [s for s in kernel.steps if s.role != "row" and stage[s.name] == p]
        if not here:
            continue
        plan, wanted = [], {s.name for s in here}
        for step in reversed(kernel.steps):  # this pass's steps, and the earlier vec values they read
            if step.name not in wanted or step.role == "row" or (step.name in done and step not in here):
                continue
            if step.name in stored and step not in here:
                plan.append(("reload", step))
                continue
            plan.append(("compute", step))
            wanted |= {a[1] for a in step.args if a[0] == "temp"}
        plan.reverse()
        reduces = [s for what, s in plan if s.role == "reduce"]
        for s in reduces:
            lines.append(f"        acc_{s.name} = {REDUCE[s.op][0].format(F=FLOAT[s.dtype])}")
        lines.append("        for j in range(n):")
        for what, step in plan:
            if what == "reload":
                lines.append(f"            {step.name} = o{slot_of[step.name]}[j]")
            elif step.role == "reduce":
                (arg,) = step.args
                fold = REDUCE[step.op][1].format(acc=f"acc_{step.name}", x=operand(arg, kernel, step.dtype))
                lines.append(f"            acc_{step.name} = {fold}")
            else:
                lines.append(f"            {step.name} = {expression(step, kernel)}")
                if step.name in slot_of and step in here:
                    lines.append(f"            o{slot_of[step.name]}[j] = {step.name}")
        for s in reduces:
            lines.append(f"        {s.name} = acc_{s.name}")
        done |= {s.name for s in reduces}
        stored |= {s.name for s in here if s.name in slot_of}
    for step in kernel.steps:  # the row values after the last pass
        if step.role == "row" and step.name not in done:
            lines.append(f"        {step.name} = {expression(step, kernel)}")
            done.add(step.name)
    for name in kernel.stores:
        if by_name[name].role != "vec":
            lines.append(f"        o{store_of[name]}[0] = {name}")
    return "\n".join(lines)


def _parking(kernel, stage, store_of):
    """{dear vec value: the output that holds it from its pass until a later pass reads it back}."""
    last_read, last_reader = {}, {}
    position = {s.name: k for k, s in enumerate(kernel.steps)}
    for step in kernel.steps:
        for a in step.args:
            if a[0] == "temp" and step.role != "row":
                last_read[a[1]] = max(last_read.get(a[1], 0), stage[step.name])
                last_reader[a[1]] = position[step.name]
    park, taken = {}, set()
    for step in kernel.steps:
        if step.role != "vec" or step.name in store_of or step.op not in EXPENSIVE:
            continue
        until = last_read.get(step.name, 0)
        if until <= stage[step.name]:
            continue
        for name, k in store_of.items():
            out = next(s for s in kernel.steps if s.name == name)
            if k not in taken and out.role == "vec" and out.dtype == step.dtype and stage[name] >= until \
                    and position[name] >= last_reader[step.name]:
                park[step.name] = k
                taken.add(k)
                break
    return park


def general_arguments(kernel):
    """The extra arguments of rows_source's GENERAL loads: for each, where each row starts (an int64 array,
    one entry per row) and, when the stride along a row is neither 0 nor 1, that stride."""
    out = []
    for ld in kernel.loads:
        if ld.kind != GENERAL:
            continue
        lead = ld.shape[:-1]
        strides = broadcast_strides(ld.ref.view, ld.shape)
        base = np.zeros(lead, dtype=np.int64)
        for d, (size, stride) in enumerate(zip(lead, strides[:-1])):
            base = base + (np.arange(size, dtype=np.int64) * stride).reshape((size,) + (1,) * (len(lead) - d - 1))
        out.append(np.ascontiguousarray(base.reshape(-1)))
        if ld.inner is None:
            out.append(int(strides[-1]))
    return out


def generate(kernel, pointwise=pointwise_source):
    """The source of the kernel's function: `pointwise` (the course's, or the learner's) where it applies."""
    return pointwise(kernel) if kernel.is_pointwise() else rows_source(kernel)

