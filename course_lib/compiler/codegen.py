"""Code generation: the source of one loop per fused group, from its Kernel (lower.py).

Every kernel is a loop over rows, spread over the threads with `prange`, and inside it a loop over the
`n` elements of the row. Each row works on slices indexed by the loop counter alone, so Numba drops its
wraparound tests and LLVM vectorizes the inner loop (fast/flat.py found the same).

Three generators write kernels:
- a pointwise generator (Pieces.pointwise: chapter 13's third exercise) writes the plain case: no
  reduction, every load FULL, ROW, COL or ONE, one pass over each row;
- `rows_source` writes the rest: several passes over each row, one per reduction they wait for (softmax:
  the max, then the sum, then the division), and loads with any strides. A value needed in a later pass
  than its own is stored there if the program needs it anyway, else computed again (an exp is cheaper
  than a round trip through memory);
- `blocked_source` writes a pointwise kernel that updates memory it reads (an optimizer's state, in
  place), block by block.
"""

from __future__ import annotations

import numpy as np

from course_lib.compiler.fuse import COL, FULL, GENERAL, ONE, ROW, broadcast_strides
from course_lib.compiler.lower import FLOAT, expression, operand
from course_lib.compiler.scalar import REDUCE

#: where row r of a load starts, by how the loop reads it (a whole row, the shared row, one value)
ROW_START = {FULL: "r * n:(r + 1) * n", ROW: ":n", COL: "r", ONE: "0"}


def _opening(kernel, extra=()):
    """The def line (outputs, then loads, then R and n and any extra arguments) and the loop over rows."""
    params = [f"out{k}" for k in range(len(kernel.stores))] + [f"in{j}" for j in range(len(kernel.loads))]
    return [f"def kernel({', '.join(params + ['R', 'n', *extra])}):", "    for r in prange(R):"]


def _formulas(kernel, indent):
    """One line per step, `t3 = ...`, at the given indent."""
    return [" " * indent + f"{step.name} = {expression(step, kernel)}" for step in kernel.steps]


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
    by_name = {s.name: s for s in kernel.steps}
    lines = _opening(kernel)
    lines += [f"        b{k} = np.empty({BLOCK}, {FLOAT[by_name[name].dtype]})" for k, name in enumerate(kernel.stores)]
    lines += [f"        for lo in range(0, n, {BLOCK}):", f"            m = min({BLOCK}, n - lo)",
              "            base = r * n + lo"]
    block_start = {FULL: "base:base + m", ROW: "lo:lo + m", COL: "r", ONE: "0"}
    lines += [f"            a{j} = in{j}[{block_start[load.kind]}]" for j, load in enumerate(kernel.loads)]
    lines.append("            for j in range(m):")
    lines += _formulas(kernel, 16)
    lines += [f"                b{k}[j] = {name}" for k, name in enumerate(kernel.stores)]
    lines += [f"            out{k}[base:base + m] = b{k}[:m]" for k in range(len(kernel.stores))]
    return "\n".join(lines)


EXPENSIVE = {"exp", "log", "sigmoid", "tanh", "gelu", "gelu_grad", "sqrt", "div", "pow"}


def rows_source(kernel):
    """The loop of any group: one pass over each row per reduction the steps wait for, then the stores.

    A vec value that a later pass reads again is read back from the output it is stored in; if it is not
    an output, it is computed again, unless it is dear (an exp, a division) and an output of a later pass
    is free to hold it until then (softmax parks exp(x - max) in its output, then divides it in place)."""
    extra = []
    for j, ld in enumerate(kernel.loads):
        if ld.kind == GENERAL:
            extra += [f"rb{j}"] + ([f"s{j}"] if ld.inner is None else [])
    lines = _opening(kernel, extra)
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
        lines.append(f"        a{j} = in{j}[{ROW_START[load.kind]}]")
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


def generate(kernel, pointwise):
    """The source of the kernel's function: `pointwise` (the course's, or the learner's) where it applies."""
    return pointwise(kernel) if kernel.is_pointwise() else rows_source(kernel)

