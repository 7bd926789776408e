"""Chapter 13's checks pass on the reference and reject the usual mistakes, including ones that give the right
numbers but break what the chapter is about (a graph with duplicate buffers, a rule that never fuses a
reduction, a loop that no thread shares, a guard that refuses every new batch)."""

import numpy as np
from checking import expect_failure, expect_pass

from course_lib.checks import ch13 as check
from course_lib.compiler.codegen import expression
from course_lib.compiler.fuse import COL, FULL, ONE, ROW, fusable, read_kind, rows_of
from course_lib.compiler.guards import is_array
from course_lib.compiler.ir import CONST, TEMP, Node, Ref, View
from course_lib.tensor import Tensor

# ---- references, written as a learner would -----------------------------------------------------------


def record(tracer, kind, op, inputs, out, into, attrs, by=lambda td: id(td.storage), copy=True, producer=True,
           scratch=True, reuse=True):
    refs = []
    for td in inputs:
        buf = tracer.by_storage.get(by(td))
        if buf is None or (not reuse and buf.kind == CONST):
            buf = tracer.buffer(CONST, td.storage)
            buf.value = np.array(td.storage) if copy else td.storage
        refs.append(Ref(buf, View.of(td)))
    if into and scratch:
        buf = tracer.by_storage[id(out.storage)]
        attrs = dict(attrs, into=True, after=buf.producer)
    else:
        buf = tracer.buffer(TEMP, out.storage)
    node = Node(len(tracer.nodes), kind, op, refs, Ref(buf, View.of(out)), attrs)
    if producer:
        buf.producer = node
    tracer.nodes.append(node)
    return node


def can_join(group, node, views=True, any_dim=False, order=True, reductions=True, rows=True):
    if not (group.fusable and fusable(node)):
        return False
    same = (lambda shape, want: rows_of(shape) == want) if rows else (lambda shape, want: tuple(shape) == group.shape)
    if node.kind == "reduce":
        loop = tuple(node.inputs[0].shape)
        if not reductions or not (node.attrs["dim"] == len(loop) - 1 or any_dim) or not same(loop, group.rows):
            return False
        role = "reduce"
    elif same(node.shape, group.rows):
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
            if views and (read_kind(ref, loop) != wanted or ref.view.offset != 0):
                return False
        elif order and producer is not None and producer.start > group.first:
            return False
    return True


def pointwise_source(kernel, row_as_full=False, col_as_full=False, reverse=False, loop="prange"):
    stores = kernel.stores[::-1] if reverse else kernel.stores
    args = [f"out{k}" for k in range(len(stores))] + [f"in{j}" for j in range(len(kernel.loads))]
    lines = [f"def kernel({', '.join(args)}, R, n):", f"    for r in {loop}(R):"]
    for k in range(len(stores)):
        lines.append(f"        o{k} = out{k}[r * n:(r + 1) * n]")
    for j, load in enumerate(kernel.loads):
        index = {FULL: "r * n:(r + 1) * n", ROW: ":n", COL: "r", ONE: "0"}[load.kind]
        if (load.kind == ROW and row_as_full) or (load.kind == COL and col_as_full):
            index = "r * n:(r + 1) * n" if load.kind == ROW else "r * n"
        lines.append(f"        a{j} = in{j}[{index}]")
    lines.append("        for j in range(n):")
    for step in kernel.steps:
        lines.append(f"            {step.name} = {expression(step, kernel)}")
    for k, name in enumerate(stores):
        lines.append(f"            o{k}[j] = {name}")
    return "\n".join(lines)


def guard(expected, args, dtypes=True, types=True, name=True, values=False):
    if len(args) != len(expected):
        return f"the step was captured with {len(expected)} arguments, this call passes {len(args)}"
    for k, (entry, arg) in enumerate(zip(expected, args)):
        where = f"argument {k}" if name else "an argument"
        if entry[0] in ("tensor", "array"):
            ok = isinstance(arg, Tensor) if entry[0] == "tensor" else is_array(arg)
            if not ok:
                return f"{where} is a {type(arg).__name__}, captured as a {entry[0]}"
            shape = tuple(arg.shape)
            dtype = np.dtype(arg.dtype).name if entry[0] == "tensor" else np.asarray(arg).dtype.name
            if shape != entry[1]:
                return f"{where} has shape {shape}, captured with {entry[1]}"
            if dtypes and dtype != entry[2]:
                return f"{where} has dtype {dtype}, captured with {entry[2]}"
            if values and entry[0] == "array":
                return f"{where} holds other values"
        elif entry[0] == "object":
            if arg is not entry[1]:
                return f"{where} is another {type(arg).__name__}"
        elif (types and type(arg) is not type(entry[1])) or arg != entry[1]:
            return f"{where} is {arg!r}, captured with {entry[1]!r}"
    return None


# ---- the checks pass on the references --------------------------------------------------------------


def test_checks_pass_on_references():
    expect_pass(check.record, record)
    expect_pass(check.can_join, can_join)
    expect_pass(check.pointwise_source, pointwise_source)
    expect_pass(check.guard, guard)


def _stub(*args, **kwargs):
    raise NotImplementedError


def test_untouched_stubs_fail():
    for c in (check.record, check.can_join, check.pointwise_source, check.guard):
        expect_failure(c, _stub, match="not implemented yet")


# ---- and reject wrong ones -----------------------------------------------------------------------------


def test_record_rejects():
    expect_failure(check.record, lambda *a: record(*a, by=id), match="by its memory")
    expect_failure(check.record, lambda *a: record(*a, copy=False), match="copy a constant")
    expect_failure(check.record, lambda *a: record(*a, producer=False), match="producer")
    expect_failure(check.record, lambda *a: record(*a, scratch=False), match="scratch")
    # the right numbers, but a buffer per use of a constant: the graph no longer says what is shared
    expect_failure(check.record, lambda *a: record(*a, reuse=False), match="one memory, one buffer")


def test_can_join_rejects():
    expect_failure(check.can_join, lambda g, n: can_join(g, n, views=False), match="transpose")
    expect_failure(check.can_join, lambda g, n: can_join(g, n, any_dim=True), match="LAST dim")
    expect_failure(check.can_join, lambda g, n: can_join(g, n, order=False), match="producer.start")
    # never wrong numbers, but softmax, layer norm and the loss would each stay several kernels
    expect_failure(check.can_join, lambda g, n: can_join(g, n, reductions=False), match="reduction")
    # never wrong numbers either, but a Linear's bias (rows, out) stays apart from the (B, T, out) ops after it
    expect_failure(check.can_join, lambda g, n: can_join(g, n, rows=False), match="rows")


def test_pointwise_source_rejects():
    expect_failure(check.pointwise_source, lambda k: pointwise_source(k, row_as_full=True), match="ROW")
    expect_failure(check.pointwise_source, lambda k: pointwise_source(k, col_as_full=True), match="COL")
    expect_failure(check.pointwise_source, lambda k: pointwise_source(k, reverse=True), match="output 0")
    # the right numbers, but one thread does every row
    expect_failure(check.pointwise_source, lambda k: pointwise_source(k, loop="range"), match="prange")


def test_guard_rejects():
    expect_failure(check.guard, lambda e, a: guard(e, a, dtypes=False), match="another dtype")
    expect_failure(check.guard, lambda e, a: guard(e, a, types=False), match="another type")
    expect_failure(check.guard, lambda e, a: guard(e, a, name=False), match="must name the argument")
    # safe, but every new batch would be captured again: the step would never replay
    expect_failure(check.guard, lambda e, a: guard(e, a, values=True), match="refused the call")

