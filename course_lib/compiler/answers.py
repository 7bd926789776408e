"""The course's answers to chapter 13's four exercises: the pieces a learner writes into the compiler.

Read each one once your check passes. The compiler runs these where a learner's own are not given
(`Pieces()`): the tracer's recording of one backend call, the fusion rule, the generator of a pointwise
group's loop, and the guard check.
"""

from __future__ import annotations

import numpy as np

from course_lib.compiler.fuse import COL, FULL, ONE, ROW, fusable, read_kind, rows_of
from course_lib.compiler.guards import is_array
from course_lib.compiler.ir import CONST, TEMP, Node, Ref, View
from course_lib.compiler.lower import expression
from course_lib.tensor import Tensor


def record(tracer, kind, op, inputs, out, into, attrs):
    """The course's answer to exercise 13.1 (`record`): read it once your check passes.

    One backend call as a node. Each input is looked up by its memory: a buffer the graph knows (an
    input, state, a value an earlier node made), or memory the step's ops did not make, a new constant
    whose values are copied now. The output's memory becomes a new buffer that this node makes, or, with
    `into`, the call wrote into a view of a scratch buffer: the node is that buffer's latest writer and
    comes after the previous one."""
    refs = []
    for td in inputs:
        buf = tracer.by_storage.get(id(td.storage))
        if buf is None:                                  # memory the step's ops did not make
            buf = tracer.buffer(CONST, td.storage)
            buf.value = np.array(td.storage)             # a copy: the library may reuse the memory
        refs.append(Ref(buf, View.of(td)))
    if into:                                             # a write into a view of a scratch buffer
        buf = tracer.by_storage[id(out.storage)]
        attrs = dict(attrs, into=True, after=buf.producer)
    else:
        buf = tracer.buffer(TEMP, out.storage)
    node = Node(len(tracer.nodes), kind, op, refs, Ref(buf, View.of(out)), attrs)
    buf.producer = node
    tracer.nodes.append(node)
    return node


def can_join(group, node):
    """The course's answer to exercise 13.2 (`can_join`): read it once your check passes.

    A node joins as a reduction over the last dim of a value with the group's rows, as a vec member (the
    group's rows), or as a row member (one value per row, in a group that reduces). A value made inside
    the group must be read where the loop makes it; one made outside, by a group that starts earlier."""
    if not (group.fusable and fusable(node)):
        return False
    if node.kind == "reduce":
        loop = tuple(node.inputs[0].shape)
        if node.attrs["dim"] != len(loop) - 1 or rows_of(loop) != group.rows:
            return False
        role = "reduce"
    elif rows_of(node.shape) == group.rows:
        role, loop = "vec", tuple(node.shape)
    elif group.reduces and rows_of(node.shape) == (group.rows[0], 1):
        role, loop = "row", tuple(node.shape)
    else:
        return False
    for ref in node.inputs:
        producer = ref.buffer.producer
        if producer in group:
            per_row = rows_of(producer.shape) != group.rows
            wanted = FULL if role == "row" or not per_row else COL
            if read_kind(ref, loop) != wanted or ref.view.offset != 0:
                return False
        elif producer is not None and producer.start > group.first:
            return False
    return True


def pointwise_source(kernel):
    """The course's answer to exercise 13.3 (`pointwise_source`): read it once your check passes.

    The loop of a group without reductions whose loads are FULL, ROW, COL or ONE: the rows spread over the
    threads, and in each row, the steps element by element."""
    outs = [f"out{k}" for k in range(len(kernel.stores))]
    ins = [f"in{j}" for j in range(len(kernel.loads))]
    lines = [f"def kernel({', '.join(outs + ins)}, R, n):", "    for r in prange(R):"]
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


def guard(expected, args):
    """The course's answer to exercise 13.4 (`guard`): read it once your check passes.

    None if a call with `args` may replay a step captured with `expected` (guards.describe's entries),
    else a sentence naming the first difference."""
    if len(args) != len(expected):
        return f"the step was captured with {len(expected)} arguments, this call passes {len(args)}"
    for k, (entry, arg) in enumerate(zip(expected, args)):
        kind = entry[0]
        if kind in ("tensor", "array"):
            if not (isinstance(arg, Tensor) if kind == "tensor" else is_array(arg)):
                return f"argument {k} is a {type(arg).__name__}, the step was captured with a {kind}"
            dtype = np.dtype(arg.dtype).name if kind == "tensor" else np.asarray(arg).dtype.name
            if tuple(arg.shape) != entry[1]:
                return f"argument {k} has shape {tuple(arg.shape)}, the step was captured with shape {entry[1]}"
            if dtype != entry[2]:
                return f"argument {k} has dtype {dtype}, the step was captured with {entry[2]}"
        elif kind == "object":
            if arg is not entry[1]:
                return f"argument {k} is another {type(arg).__name__} than the one the step was captured with"
        elif type(arg) is not type(entry[1]) or not _equal(arg, entry[1]):
            return f"argument {k} is {arg!r}, the step was captured with {entry[1]!r} (a value is baked into the step)"
    return None


def _equal(a, b):
    """a == b as one bool, for values whose == is not one (an array's) or raises."""
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values without a plain ==
        return a is b
