"""Chapter 13: fresh answers (scratch for the audit)."""

import numpy as np
import pytest

from course_lib import tensor as T
from course_lib.checks import CheckFailed
from course_lib.checks import ch13 as check
from course_lib.compiler.fuse import COL, FULL, ONE, ROW, fusable, read_kind, rows_of
from course_lib.compiler.guards import is_array
from course_lib.compiler.ir import CONST, TEMP, Node, Ref, View
from course_lib.compiler.lower import expression


@pytest.fixture(autouse=True)
def _isolated(workspace):
    """A passing check saves the answer: keep it in a temporary workspace."""


# ---------------------------------------------------------------- 1. record

def record_lookup_first(tracer, kind, op, inputs, out, into, attrs):
    """Correct, written differently: a helper per operand, the scratch write first, attrs copied up front."""
    attrs = dict(attrs)

    def operand(td):
        known = tracer.by_storage.get(id(td.storage))
        if known is None:
            known = tracer.buffer(CONST, td.storage)
            known.value = td.storage.copy()
        return Ref(known, View(tuple(td.shape), tuple(td.strides), int(td.offset)))

    operands = [operand(td) for td in inputs]
    if into:
        target = tracer.by_storage[id(out.storage)]
        attrs["into"] = True
        attrs["after"] = target.producer
    else:
        target = tracer.buffer(TEMP, out.storage)
    node = Node(id=len(tracer.nodes), kind=kind, op=op, inputs=operands,
                out=Ref(target, View(tuple(out.shape), tuple(out.strides), int(out.offset))), attrs=attrs)
    target.producer = node
    tracer.nodes.append(node)
    return node


def make_record(copy_const=True, by_view=False, after=True, keep_attrs=True, into_new=False):
    def record(tracer, kind, op, inputs, out, into, attrs):
        refs = []
        for td in inputs:
            key = id(td) if by_view else id(td.storage)
            buf = tracer.by_storage.get(key)
            if buf is None:
                buf = tracer.buffer(CONST, td.storage)
                if by_view:
                    tracer.by_storage[id(td)] = buf
                buf.value = np.array(td.storage) if copy_const else td.storage
            refs.append(Ref(buf, View.of(td)))
        new_attrs = dict(attrs) if keep_attrs else {}
        if into and not into_new:
            buf = tracer.by_storage[id(out.storage)]
            new_attrs["into"] = True
            if after:
                new_attrs["after"] = buf.producer
        else:
            buf = tracer.buffer(TEMP, out.storage)
        node = Node(len(tracer.nodes), kind, op, refs, Ref(buf, View.of(out)), new_attrs)
        buf.producer = node
        tracer.nodes.append(node)
        return node
    return record


# ---------------------------------------------------------------- 2. can_join

def can_join_careful(group, node):
    """The lesson's careful rule, on nodes: an elementwise op joins when it has the group's rows, reads the
    group's values at its own element, and reads nothing made later. No reductions."""
    if not group.fusable or group.reduces or not fusable(node) or node.kind == "reduce":
        return False
    if rows_of(node.shape) != group.rows:
        return False
    for ref in node.inputs:
        maker = ref.buffer.producer
        if maker is None:
            continue
        if maker in group:
            if read_kind(ref, tuple(node.shape)) != FULL or ref.view.offset != 0:
                return False
        elif maker.start > group.first:
            return False
    return True


def can_join_rows(group, node):
    """Correct, written my way: elementwise ops and last-dim reductions; per-row values after a reduction;
    in-group values read at the loop's own element (a per-row value: one per row)."""
    if not (group.fusable and fusable(node)):
        return False
    R, n = group.rows
    if node.kind == "reduce":
        shape = tuple(node.inputs[0].shape)
        if not shape or node.attrs["dim"] % len(shape) != len(shape) - 1 or rows_of(shape) != (R, n):
            return False
        consumer_per_row, loop = False, shape
    elif rows_of(node.shape) == (R, n):
        consumer_per_row, loop = False, tuple(node.shape)
    elif group.reduces and rows_of(node.shape) == (R, 1):
        consumer_per_row, loop = True, tuple(node.shape)
    else:
        return False
    for ref in node.inputs:
        maker = ref.buffer.producer
        if maker is None:
            continue
        if maker not in group:
            if maker.start > group.first:
                return False
            continue
        if ref.view.offset != 0:
            return False
        made_per_row = rows_of(maker.shape) != (R, n)
        if made_per_row and not consumer_per_row:
            if read_kind(ref, loop) != COL:
                return False
        elif not made_per_row and consumer_per_row:
            return False
        elif read_kind(ref, loop) != FULL:
            return False
    return True


def can_join_any_view(group, node):
    """Wrong: reads of in-group values through any view (a + a.T) allowed."""
    if not (group.fusable and fusable(node)) or node.kind == "reduce":
        return False
    if rows_of(node.shape) != group.rows:
        return False
    for ref in node.inputs:
        maker = ref.buffer.producer
        if maker is not None and maker not in group and maker.start > group.first:
            return False
    return True


def can_join_no_order(group, node):
    """Wrong: ignores whether an outside value exists yet."""
    if not (group.fusable and fusable(node)) or node.kind == "reduce":
        return False
    if rows_of(node.shape) != group.rows:
        return False
    for ref in node.inputs:
        maker = ref.buffer.producer
        if maker in group and (read_kind(ref, tuple(node.shape)) != FULL or ref.view.offset != 0):
            return False
    return True


def can_join_any_dim(group, node):
    """Wrong: a reduction over any dim joins."""
    if not (group.fusable and fusable(node)):
        return False
    shape = tuple(node.inputs[0].shape) if node.kind == "reduce" else tuple(node.shape)
    if rows_of(shape) != group.rows and not (group.reduces and rows_of(node.shape)[0] == group.rows[0]):
        return False
    for ref in node.inputs:
        maker = ref.buffer.producer
        if maker is None:
            continue
        if maker in group:
            if read_kind(ref, shape) not in (FULL, COL) or ref.view.offset != 0:
                return False
        elif maker.start > group.first:
            return False
    return True


def can_join_never(group, node):
    """Right (nothing illegal), but fuses nothing."""
    return False


# ---------------------------------------------------------------- 3. pointwise source

def pointwise_flat_index(kernel):
    """Correct: rows under prange, no slices for the outputs (written at r * n + j), ROW loads as they are."""
    nout, nin = len(kernel.stores), len(kernel.loads)
    head = ", ".join([f"out{k}" for k in range(nout)] + [f"in{j}" for j in range(nin)] + ["R", "n"])
    src = [f"def kernel({head}):", "    for r in prange(R):", "        base = r * n"]
    for j, load in enumerate(kernel.loads):
        if load.kind == FULL:
            src.append(f"        a{j} = in{j}[base:base + n]")
        elif load.kind == ROW:
            src.append(f"        a{j} = in{j}")
        elif load.kind == COL:
            src.append(f"        a{j} = in{j}[r]")
        else:
            src.append(f"        a{j} = in{j}[0]")
    src.append("        for j in range(n):")
    src += [f"            {s.name} = {expression(s, kernel)}" for s in kernel.steps]
    src += [f"            out{k}[base + j] = {name}" for k, name in enumerate(kernel.stores)]
    return "\n".join(src)


def pointwise_one_loop(kernel):
    """Correct: one prange over every element, its row and column by division."""
    nout, nin = len(kernel.stores), len(kernel.loads)
    head = ", ".join([f"out{k}" for k in range(nout)] + [f"in{j}" for j in range(nin)] + ["R", "n"])
    src = [f"def kernel({head}):", "    for i in prange(R * n):", "        r = i // n", "        j0 = i - r * n"]
    for j, load in enumerate(kernel.loads):
        if load.kind == FULL:
            src.append(f"        a{j} = in{j}[r * n:r * n + n]")
        elif load.kind == ROW:
            src.append(f"        a{j} = in{j}")
        elif load.kind == COL:
            src.append(f"        a{j} = in{j}[r]")
        else:
            src.append(f"        a{j} = in{j}[0]")
    src.append("        for j in range(j0, j0 + 1):")
    src += [f"            {s.name} = {expression(s, kernel)}" for s in kernel.steps]
    src += [f"            out{k}[i] = {name}" for k, name in enumerate(kernel.stores)]
    return "\n".join(src)


def pointwise_row_blocks(kernel):
    """Correct: prange over blocks of 4 rows, each row alone inside."""
    nout, nin = len(kernel.stores), len(kernel.loads)
    head = ", ".join([f"out{k}" for k in range(nout)] + [f"in{j}" for j in range(nin)] + ["R", "n"])
    src = [f"def kernel({head}):", "    for blk in prange((R + 3) // 4):", "        for r in range(4 * blk, min(R, 4 * blk + 4)):"]
    for j, load in enumerate(kernel.loads):
        index = {FULL: "r * n:(r + 1) * n", ROW: ":n", COL: "r", ONE: "0"}[load.kind]
        src.append(f"            a{j} = in{j}[{index}]")
    src.append("            for j in range(n):")
    src += [f"                {s.name} = {expression(s, kernel)}" for s in kernel.steps]
    src += [f"                out{k}[r * n + j] = {name}" for k, name in enumerate(kernel.stores)]
    return "\n".join(src)


def pointwise_columns_parallel(kernel):
    """Right numbers; rows serial, prange over the columns."""
    nout, nin = len(kernel.stores), len(kernel.loads)
    head = ", ".join([f"out{k}" for k in range(nout)] + [f"in{j}" for j in range(nin)] + ["R", "n"])
    src = [f"def kernel({head}):", "    for r in range(R):"]
    for j, load in enumerate(kernel.loads):
        index = {FULL: "r * n:(r + 1) * n", ROW: ":n", COL: "r", ONE: "0"}[load.kind]
        src.append(f"        a{j} = in{j}[{index}]")
    src.append("        for j in prange(n):")
    src += [f"            {s.name} = {expression(s, kernel)}" for s in kernel.steps]
    src += [f"            out{k}[r * n + j] = {name}" for k, name in enumerate(kernel.stores)]
    return "\n".join(src)


def pointwise_prange_of_one(kernel):
    """Right numbers; the text has prange, but a prange of one iteration around a serial loop."""
    nout, nin = len(kernel.stores), len(kernel.loads)
    head = ", ".join([f"out{k}" for k in range(nout)] + [f"in{j}" for j in range(nin)] + ["R", "n"])
    src = [f"def kernel({head}):", "    for _ in prange(1):", "        for r in range(R):"]
    for j, load in enumerate(kernel.loads):
        index = {FULL: "r * n:(r + 1) * n", ROW: ":n", COL: "r", ONE: "0"}[load.kind]
        src.append(f"            a{j} = in{j}[{index}]")
    src.append("            for j in range(n):")
    src += [f"                {s.name} = {expression(s, kernel)}" for s in kernel.steps]
    src += [f"                out{k}[r * n + j] = {name}" for k, name in enumerate(kernel.stores)]
    return "\n".join(src)


def pointwise_col_by_j(kernel):
    """Wrong: a COL load read at the column, not the row."""
    nout, nin = len(kernel.stores), len(kernel.loads)
    head = ", ".join([f"out{k}" for k in range(nout)] + [f"in{j}" for j in range(nin)] + ["R", "n"])
    src = [f"def kernel({head}):", "    for r in prange(R):"]
    for j, load in enumerate(kernel.loads):
        index = {FULL: "r * n:(r + 1) * n", ROW: ":n", COL: "r", ONE: "0"}[load.kind]
        src.append(f"        a{j} = in{j}[{index}]" if load.kind != COL else f"        c{j} = in{j}")
    src.append("        for j in range(n):")
    for j, load in enumerate(kernel.loads):
        if load.kind == COL:
            src.append(f"            a{j} = c{j}[j % c{j}.shape[0]]")
    src += [f"            {s.name} = {expression(s, kernel)}" for s in kernel.steps]
    src += [f"            out{k}[r * n + j] = {name}" for k, name in enumerate(kernel.stores)]
    return "\n".join(src)


# ---------------------------------------------------------------- 4. guard

def guard_my_words(expected, args):
    """Correct: its own wording and order (kind, then dtype, then shape)."""
    if len(args) != len(expected):
        return f"{len(args)} arguments now, {len(expected)} at capture"
    for i, (entry, value) in enumerate(zip(expected, args)):
        what = entry[0]
        if what == "tensor" or what == "array":
            is_tensor = isinstance(value, T.Tensor)
            ok_kind = is_tensor if what == "tensor" else (is_array(value) and not is_tensor)
            if not ok_kind:
                return f"arg #{i}: a {what} at capture, now a {type(value).__name__}"
            dt = np.dtype(value.dtype).name if is_tensor else np.asarray(value).dtype.name
            if dt != entry[2]:
                return f"arg #{i}: dtype {dt} now, {entry[2]} at capture"
            if tuple(value.shape) != tuple(entry[1]):
                return f"arg #{i}: shape {tuple(value.shape)} now, {tuple(entry[1])} at capture"
        elif what == "object":
            if value is not entry[1]:
                return f"arg #{i}: not the {type(entry[1]).__name__} object seen at capture (now {type(value).__name__})"
        else:
            if type(value) is not type(entry[1]) or value != entry[1]:
                return f"arg #{i}: {value!r} ({type(value).__name__}) now, {entry[1]!r} ({type(entry[1]).__name__}) at capture"
    return None


def make_guard(check_dtype=True, strict_type=True, check_kind=True, from_one=False, vague=False, check_len=True):
    def guard(expected, args):
        if check_len and len(args) != len(expected):
            return f"the step was captured with {len(expected)} arguments, this call passes {len(args)}"
        for k, (entry, arg) in enumerate(zip(expected, args)):
            pos = k + 1 if from_one else k
            kind = entry[0]
            if kind in ("tensor", "array"):
                if check_kind and not (isinstance(arg, T.Tensor) if kind == "tensor" else is_array(arg)):
                    return f"argument {pos} is a {type(arg).__name__}, the step was captured with a {kind}"
                if not hasattr(arg, "shape"):
                    return f"argument {pos} is a {type(arg).__name__}, the step was captured with a {kind}"
                dtype = np.dtype(arg.dtype).name if isinstance(arg, T.Tensor) else np.asarray(arg).dtype.name
                if tuple(arg.shape) != entry[1]:
                    if vague:
                        return f"argument {pos} differs"
                    return f"argument {pos} has shape {tuple(arg.shape)}, the step was captured with shape {entry[1]}"
                if check_dtype and dtype != entry[2]:
                    return f"argument {pos} has dtype {dtype}, the step was captured with {entry[2]}"
            elif kind == "object":
                if arg is not entry[1]:
                    return f"argument {pos} is another {type(arg).__name__} than the one the step was captured with"
            else:
                differs = (type(arg) is not type(entry[1]) or arg != entry[1]) if strict_type else arg != entry[1]
                if differs:
                    return f"argument {pos} is {arg!r}, the step was captured with {entry[1]!r}"
        return None
    return guard


# ---------------------------------------------------------------- the cases

ACCEPT = [
    ("record", lambda: check.record(record_lookup_first)),
    ("can_join_careful", lambda: check.can_join(can_join_careful)),
    ("can_join_rows", lambda: check.can_join(can_join_rows)),
    ("pointwise_flat_index", lambda: check.pointwise_source(pointwise_flat_index)),
    ("pointwise_one_loop", lambda: check.pointwise_source(pointwise_one_loop)),
    ("pointwise_row_blocks", lambda: check.pointwise_source(pointwise_row_blocks)),
    ("guard", lambda: check.guard(guard_my_words)),
]

REJECT = [
    ("record_const_not_copied", lambda: check.record(make_record(copy_const=False))),
    ("record_buffer_per_view", lambda: check.record(make_record(by_view=True))),
    ("record_no_after", lambda: check.record(make_record(after=False))),
    ("record_drops_attrs", lambda: check.record(make_record(keep_attrs=False))),
    ("record_into_new_temp", lambda: check.record(make_record(into_new=True))),
    ("can_join_any_view", lambda: check.can_join(can_join_any_view)),
    ("can_join_no_order", lambda: check.can_join(can_join_no_order)),
    ("can_join_any_dim", lambda: check.can_join(can_join_any_dim)),
    ("can_join_never", lambda: check.can_join(can_join_never)),
    ("pointwise_columns_parallel", lambda: check.pointwise_source(pointwise_columns_parallel)),
    ("pointwise_prange_of_one", lambda: check.pointwise_source(pointwise_prange_of_one)),
    ("pointwise_col_by_j", lambda: check.pointwise_source(pointwise_col_by_j)),
    ("guard_ignores_dtype", lambda: check.guard(make_guard(check_dtype=False))),
    ("guard_equal_not_same", lambda: check.guard(make_guard(strict_type=False))),
    ("guard_ignores_kind", lambda: check.guard(make_guard(check_kind=False))),
    ("guard_counts_from_one", lambda: check.guard(make_guard(from_one=True))),
    ("guard_vague", lambda: check.guard(make_guard(vague=True))),
    ("guard_no_length", lambda: check.guard(make_guard(check_len=False))),
]


@pytest.mark.parametrize("name, run", ACCEPT, ids=[c[0] for c in ACCEPT])
def test_accept(name, run):
    run()


@pytest.mark.parametrize("name, run", REJECT, ids=[c[0] for c in REJECT])
def test_reject(name, run):
    with pytest.raises(CheckFailed) as info:
        run()
    print(str(info.value)[:800])
