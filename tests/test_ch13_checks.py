"""Chapter 13's checks judge each piece by the property the chapter teaches, not by its likeness to the course's
answer: they pass on the course's answers and on correct pieces written otherwise (another fusion rule, the
lesson's own among them; a kernel that spreads single elements or blocks of rows; a guard that words its
sentences its own way), and reject plausible mistakes, among them ones that give the right numbers but break
the property (a graph with a buffer per use of a constant, a rule that fuses nothing, a kernel whose threads
would not share the rows or whose rows depend on each other, a guard that never tells a tensor from an array)."""

import numpy as np
import pytest
from checking import expect_failure, expect_pass
from edits import edited

from course_lib import tensor as T
from course_lib.checks import ch13 as check
from course_lib.compiler.answers import can_join, guard, pointwise_source, record
from course_lib.compiler.fuse import COL, FULL, ONE, ROW, fusable, read_kind, rows_of
from course_lib.compiler.guards import is_array
from course_lib.compiler.ir import CONST, TEMP, Node, Ref, View
from course_lib.compiler.lower import expression

# ---- wrong pieces: each is the course's answer with one mistake edited in -------------------------------------

# record
record_by_tensor = edited(record, "record_by_tensor", ("by_storage.get(id(td.storage))", "by_storage.get(id(td))"))
record_no_copy = edited(record, "record_no_copy", ("buf.value = np.array(td.storage)", "buf.value = td.storage"))
record_no_producer = edited(record, "record_no_producer", ("    buf.producer = node\n", ""))
record_no_scratch = edited(record, "record_no_scratch", ("if into:", "if False:"))
record_no_order = edited(record, "record_no_order", ("attrs = dict(attrs, into=True, after=buf.producer)",
                                                     "attrs = dict(attrs, into=True)"))
# the right numbers, but a buffer per use of a constant: the graph no longer says what is shared
record_const_per_use = edited(record, "record_const_per_use", ("if buf is None:", "if buf is None or buf.kind == CONST:"))

# can_join
join_any_view = edited(can_join, "join_any_view", ("if read_kind(ref, loop) != wanted or ref.view.offset != 0:",
                                                   "if False:"))
join_any_offset = edited(can_join, "join_any_offset", (" or ref.view.offset != 0", ""))
join_any_dim = edited(can_join, "join_any_dim", ('node.attrs["dim"] != len(loop) - 1 or ', ""))
join_out_of_order = edited(can_join, "join_out_of_order", ("elif producer is not None and", "elif False and"))
join_products = edited(can_join, "join_products", ("if not (group.fusable and fusable(node)):", "if False:"))


def join_never(group, node):
    """The right numbers, always: nothing is fused, so the compiled step is the eager step's calls in a row."""
    return False


# pointwise_source
source_row_as_full = edited(pointwise_source, "source_row_as_full", ('ROW: ":n"', 'ROW: "r * n:(r + 1) * n"'))
source_col_as_full = edited(pointwise_source, "source_col_as_full", ('COL: "r"', 'COL: "r * n"'))
source_stores_reversed = edited(pointwise_source, "source_stores_reversed",
                                ("enumerate(kernel.stores)", "enumerate(kernel.stores[::-1])"))
# the right numbers, but no thread shares the rows
source_serial = edited(pointwise_source, "source_serial", ("prange(R)", "range(R)"))
source_prange_in_a_comment = edited(pointwise_source, "source_prange_in_a_comment",
                                    ('"    for r in prange(R):"', '"    for r in range(R):  # prange(R)"'))
source_columns_parallel = edited(pointwise_source, "source_columns_parallel", ("prange(R)", "range(R)"),
                                 ('"        for j in range(n):"', '"        for j in prange(n):"'))


def source_columns_outside(kernel):
    """The right numbers: prange over the columns, outermost, and the rows serial inside it."""
    outs, ins = len(kernel.stores), len(kernel.loads)
    head = ", ".join([f"out{k}" for k in range(outs)] + [f"in{j}" for j in range(ins)] + ["R", "n"])
    lines = [f"def kernel({head}):", "    for j in prange(n):", "        for r in range(R):"]
    for k in range(outs):
        lines.append(f"            o{k} = out{k}[r * n:(r + 1) * n]")
    for j, load in enumerate(kernel.loads):
        lines.append(f"            a{j} = in{j}[{ {FULL: 'r * n:(r + 1) * n', ROW: ':n', COL: 'r', ONE: '0'}[load.kind]}]")
    lines += [f"            {s.name} = {expression(s, kernel)}" for s in kernel.steps]
    lines += [f"            o{k}[j] = {name}" for k, name in enumerate(kernel.stores)]
    return "\n".join(lines)


# the right numbers when the rows run in order, but each row finds its place from the row before (a race
# once the threads share the rows)
source_rows_in_order = edited(pointwise_source, "source_rows_in_order",
                              ('lines = [f"def kernel({\', \'.join(outs + ins)}, R, n):", "    for r in prange(R):"]',
                               'lines = [f"def kernel({\', \'.join(outs + ins)}, R, n):", "    start = 0", '
                               '"    for r in prange(R):"]'),
                              ('lines.append(f"        o{k} = out{k}[r * n:(r + 1) * n]")',
                               'lines.append(f"        o{k} = out{k}[start:start + n]")'),
                              ('    lines.append("        for j in range(n):")',
                               '    lines.append("        start += n")\n    lines.append("        for j in range(n):")'))

# guard
guard_any_dtype = edited(guard, "guard_any_dtype", ("if dtype != entry[2]:", "if False:"))
guard_any_type = edited(guard, "guard_any_type", ("type(arg) is not type(entry[1]) or ", ""))
guard_no_name = edited(guard, "guard_no_name", ('f"argument {k} ', 'f"an argument ', 5))
# safe, but every new batch would be captured again: the step would never replay
guard_every_array = edited(guard, "guard_every_array", ("if dtype != entry[2]:", 'if dtype != entry[2] or kind == "array":'))
# the right verdict for every shape and dtype, but an array passes where a tensor was captured
guard_no_kind = edited(guard, "guard_no_kind", ('if not (isinstance(arg, Tensor) if kind == "tensor" else is_array(arg)):',
                                                "if False:"))
guard_says_only_which = edited(guard, "guard_says_only_which",
                               ('return f"argument {k} has shape {tuple(arg.shape)}, the step was captured with shape '
                                '{entry[1]}"', 'return f"argument {k} has another shape"'))


def guard_accepts_all(expected, args):
    return None


# ---- correct pieces written otherwise ------------------------------------------------------------------------


def record_in_other_words(tracer, kind, op, inputs, out, into, attrs):
    """Operands found by a helper, a dict of attrs built up, the node appended before its producer is set."""
    def operand(td):
        known = tracer.by_storage
        if id(td.storage) not in known:
            fresh = tracer.buffer(CONST, td.storage)
            fresh.value = td.storage.copy()
        return Ref(known[id(td.storage)], View(tuple(td.shape), tuple(td.strides), int(td.offset)))

    extra = dict(attrs)
    if into:
        target = tracer.by_storage[id(out.storage)]
        extra.update(into=True, after=target.producer)
    else:
        target = tracer.buffer(TEMP, out.storage)
    node = Node(len(tracer.nodes), kind, op, [operand(td) for td in inputs], Ref(target, View.of(out)), extra)
    tracer.nodes.append(node)
    target.producer = node
    return node


def record_with_value_of(tracer, kind, op, inputs, out, into, attrs):
    """The tracer's own lookup for the operands (value_of), the rest by hand."""
    refs = [tracer.value_of(td) for td in inputs]
    buf = tracer.by_storage[id(out.storage)] if into else tracer.buffer(TEMP, out.storage)
    if into:
        attrs = {**attrs, "into": True, "after": buf.producer}
    node = Node(len(tracer.nodes), kind, op, refs, Ref(buf, View.of(out)), attrs)
    buf.producer = node
    tracer.nodes.append(node)
    return node


def join_like_the_lesson(group, node):
    """The lesson's first, careful rule (section 6): an elementwise op joins when it has the group's very shape
    and reads the group's values where they lie; no reductions, no reshapes, no row values."""
    if not (group.fusable and fusable(node)) or node.kind == "reduce" or group.reduces:
        return False
    if tuple(node.shape) != tuple(group.shape):
        return False
    for ref in node.inputs:
        maker = ref.buffer.producer
        if maker in group:
            if read_kind(ref, node.shape) != FULL or ref.view.offset != 0:
                return False
        elif maker is not None and maker.start > group.first:
            return False
    return True


def join_in_other_words(group, node):
    """The course's grouping, found another way: outside values first, then what the node is, then its reads."""
    if not group.fusable or not fusable(node):
        return False
    outside = [r for r in node.inputs if r.buffer.producer is not None and r.buffer.producer not in group]
    if any(r.buffer.producer.start >= group.first for r in outside):
        return False
    over = tuple(node.inputs[0].shape) if node.kind == "reduce" else tuple(node.shape)
    if node.kind == "reduce" and (node.attrs["dim"] + 1 != len(over) or rows_of(over) != group.rows):
        return False
    is_row = node.kind != "reduce" and rows_of(over) != group.rows
    if is_row and not (group.reduces and rows_of(over) == (group.rows[0], 1)):
        return False
    for r in node.inputs:
        if r.buffer.producer in group:
            made_per_row = rows_of(r.buffer.producer.shape) == (group.rows[0], 1) != group.rows
            if r.view.offset or read_kind(r, over) != (COL if made_per_row and not is_row else FULL):
                return False
    return True


def _load_at(kind, index):
    return {FULL: f"{index}", ROW: "j", COL: "r", ONE: "0"}[kind]


def source_element_by_element(kernel):
    """One prange over all R * n elements, each finding its row and column; the loads bound per element."""
    params = [f"out{k}" for k in range(len(kernel.stores))] + [f"in{j}" for j in range(len(kernel.loads))]
    body = ["    for e in prange(R * n):", "        r = e // n", "        j = e - r * n"]
    for j, load in enumerate(kernel.loads):
        body.append(f"        a{j} = in{j}[r * n:(r + 1) * n]" if load.kind == FULL else
                    f"        a{j} = in{j}[:n]" if load.kind == ROW else f"        a{j} = in{j}[{_load_at(load.kind, '')}]")
    body += [f"        {s.name} = {expression(s, kernel)}" for s in kernel.steps]
    body += [f"        out{k}[e] = {name}" for k, name in enumerate(kernel.stores)]
    return f"def kernel({', '.join(params)}, R, n):\n" + "\n".join(body)


def source_blocks_of_rows(kernel, block=4):
    """A prange over blocks of `block` rows, the rows of a block in order."""
    outs = len(kernel.stores)
    text = "def kernel(" + ", ".join([f"out{k}" for k in range(outs)] + [f"in{j}" for j in range(len(kernel.loads))])
    text += ", R, n):\n"
    text += f"    for b in prange((R + {block - 1}) // {block}):\n"
    text += f"        for r in range(b * {block}, min(R, (b + 1) * {block})):\n"
    for j, load in enumerate(kernel.loads):
        text += f"            a{j} = in{j}[{ {FULL: 'r * n:r * n + n', ROW: '0:n', COL: 'r', ONE: '0'}[load.kind]}]\n"
    text += "            for j in range(n):\n"
    for s in kernel.steps:
        text += f"                {s.name} = {expression(s, kernel)}\n"
    for k, name in enumerate(kernel.stores):
        text += f"                out{k}[r * n + j] = {name}\n"
    return text


ORDINAL = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


def guard_in_other_words(expected, args):
    """The same verdicts, worded otherwise: ordinal words, 'expected ..., got ...', shapes as lists."""
    if len(args) != len(expected):
        return f"expected 7 arguments, got {len(args)}" if len(expected) == 7 else "wrong number of arguments"
    for k, (entry, value) in enumerate(zip(expected, args)):
        what = entry[0]
        if what == "object":
            if value is not entry[1]:
                return f"the {ORDINAL[k]} argument is not the very object the step was compiled for"
            continue
        if what == "value":
            if type(value) is not type(entry[1]) or value != entry[1]:
                return (f"the {ORDINAL[k]} argument: expected {entry[1]!r} ({type(entry[1]).__name__}), "
                        f"got {value!r} ({type(value).__name__})")
            continue
        now = "tensor" if isinstance(value, T.Tensor) else "array" if is_array(value) else type(value).__name__
        if now != what:
            return f"the {ORDINAL[k]} argument: expected a {what}, got a {now}"
        shape, dtype = list(value.shape), np.dtype(value.dtype).name if now == "tensor" else np.asarray(value).dtype.name
        if shape != list(entry[1]) or dtype != entry[2]:
            return f"the {ORDINAL[k]} argument: expected {list(entry[1])} {entry[2]}, got {shape} {dtype}"
    return None


# ---- the checks pass on the course's answers, and on correct pieces written otherwise ---------------------------


@pytest.mark.parametrize("name, piece", [
    ("record", record), ("record", record_in_other_words), ("record", record_with_value_of),
    ("can_join", can_join), ("can_join", join_like_the_lesson), ("can_join", join_in_other_words),
    ("pointwise_source", pointwise_source), ("pointwise_source", source_element_by_element),
    ("pointwise_source", source_blocks_of_rows),
    ("guard", guard), ("guard", guard_in_other_words),
])
def test_checks_pass(name, piece):
    expect_pass(getattr(check, name), piece)


def _stub(*args, **kwargs):
    raise NotImplementedError


def test_untouched_stubs_fail():
    for c in (check.record, check.can_join, check.pointwise_source, check.guard):
        expect_failure(c, _stub, match="not implemented yet")


# ---- and reject wrong ones -----------------------------------------------------------------------------


@pytest.mark.parametrize("name, wrong, hint", [
    ("record", record_by_tensor, "by their memory"),
    ("record", record_no_copy, "kept as they were"),
    ("record", record_no_producer, "producer"),
    ("record", record_no_scratch, "existing memory"),
    ("record", record_no_order, "so the writes keep their order"),
    ("record", record_const_per_use, "one memory, one buffer"),
    ("can_join", join_any_view, "transpose"),
    ("can_join", join_any_offset, "offset 1"),
    ("can_join", join_any_dim, "dim 0"),
    ("can_join", join_out_of_order, "starts after this one"),
    ("can_join", join_products, "product"),
    ("can_join", join_never, "share a loop"),
    ("pointwise_source", source_row_as_full, "output 0"),
    ("pointwise_source", source_col_as_full, "output 0"),
    ("pointwise_source", source_stores_reversed, "output 0"),
    ("pointwise_source", source_serial, "outermost loop is a serial range"),
    ("pointwise_source", source_prange_in_a_comment, "outermost loop is a serial range"),
    ("pointwise_source", source_columns_parallel, "outermost loop is a serial range"),
    ("pointwise_source", source_columns_outside, "does not hand out the rows"),
    ("pointwise_source", source_rows_in_order, "shuffled order"),
    ("guard", guard_any_dtype, "another dtype"),
    ("guard", guard_any_type, "another type"),
    ("guard", guard_no_name, "does not say which argument"),
    ("guard", guard_every_array, "refused the call"),
    ("guard", guard_no_kind, "a numpy array where a tensor was captured"),
    ("guard", guard_says_only_which, "both shapes"),
    ("guard", guard_accepts_all, "it must return a sentence"),
])
def test_checks_reject(name, wrong, hint):
    expect_failure(getattr(check, name), wrong, match=hint)
