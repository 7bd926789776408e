"""Chapter 13's checks pass on the reference and reject the usual mistakes, including ones that give the right
numbers but break what the chapter is about (a graph with duplicate buffers, a rule that never fuses a
reduction, a loop that no thread shares, a guard that refuses every new batch)."""

import pytest
from checking import expect_failure, expect_pass
from edits import edited

from course_lib.checks import ch13 as check
from course_lib.compiler.codegen import pointwise_source
from course_lib.compiler.fuse import can_join
from course_lib.compiler.guards import guard
from course_lib.compiler.trace import record

# ---- the references are the library's own; each wrong one is a reference with one mistake edited in ------

# record (course_lib/compiler/trace.py)
record_by_tensor = edited(record, "record_by_tensor", ("by_storage.get(id(td.storage))", "by_storage.get(id(td))"))
record_no_copy = edited(record, "record_no_copy", ("buf.value = np.array(td.storage)", "buf.value = td.storage"))
record_no_producer = edited(record, "record_no_producer", ("    buf.producer = node\n", ""))
record_no_scratch = edited(record, "record_no_scratch", ("if into:", "if False:"))
# the right numbers, but a buffer per use of a constant: the graph no longer says what is shared
record_const_per_use = edited(record, "record_const_per_use", ("if buf is None:", "if buf is None or buf.kind == CONST:"))

# can_join (course_lib/compiler/fuse.py)
join_any_view = edited(can_join, "join_any_view", ("if read_kind(ref, loop) != wanted or ref.view.offset != 0:", "if False:"))
join_any_dim = edited(can_join, "join_any_dim", ('node.attrs["dim"] != len(loop) - 1 or ', ""))
join_out_of_order = edited(can_join, "join_out_of_order", ("elif producer is not None and", "elif False and"))
# never wrong numbers, but softmax, layer norm and the loss would each stay several kernels
join_no_reduction = edited(can_join, "join_no_reduction", ('role, loop = "reduce", tuple(node.inputs[0].shape)', "return False"))
# never wrong numbers either, but a Linear's bias (rows, out) stays apart from the (B, T, out) ops after it
join_same_shape = edited(can_join, "join_same_shape", ("rows_of(loop) != group.rows", "loop != group.shape"),
                         ("elif rows_of(node.shape) == group.rows", "elif tuple(node.shape) == group.shape"))

# pointwise_source (course_lib/compiler/codegen.py)
source_row_as_full = edited(pointwise_source, "source_row_as_full", ('ROW: ":n"', 'ROW: "r * n:(r + 1) * n"'))
source_col_as_full = edited(pointwise_source, "source_col_as_full", ('COL: "r"', 'COL: "r * n"'))
source_stores_reversed = edited(pointwise_source, "source_stores_reversed",
                                ("enumerate(kernel.stores)", "enumerate(kernel.stores[::-1])"))
# the right numbers, but one thread does every row
source_serial = edited(pointwise_source, "source_serial", ("prange(R)", "range(R)"))

# guard (course_lib/compiler/guards.py)
guard_any_dtype = edited(guard, "guard_any_dtype", ("if dtype != entry[2]:", "if False:"))
guard_any_type = edited(guard, "guard_any_type", ("type(arg) is not type(entry[1]) or ", ""))
guard_no_name = edited(guard, "guard_no_name", ('f"argument {k} ', 'f"an argument ', 5))
# safe, but every new batch would be captured again: the step would never replay
guard_every_array = edited(guard, "guard_every_array", ("if dtype != entry[2]:", 'if dtype != entry[2] or kind == "array":'))


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


@pytest.mark.parametrize("name, wrong, hint", [
    ("record", record_by_tensor, "by its memory"),
    ("record", record_no_copy, "copy a constant"),
    ("record", record_no_producer, "producer"),
    ("record", record_no_scratch, "scratch"),
    ("record", record_const_per_use, "one memory, one buffer"),
    ("can_join", join_any_view, "transpose"),
    ("can_join", join_any_dim, "LAST dim"),
    ("can_join", join_out_of_order, "producer.start"),
    ("can_join", join_no_reduction, "reduction"),
    ("can_join", join_same_shape, "rows"),
    ("pointwise_source", source_row_as_full, "ROW"),
    ("pointwise_source", source_col_as_full, "COL"),
    ("pointwise_source", source_stores_reversed, "output 0"),
    ("pointwise_source", source_serial, "prange"),
    ("guard", guard_any_dtype, "another dtype"),
    ("guard", guard_any_type, "another type"),
    ("guard", guard_no_name, "must name the argument"),
    ("guard", guard_every_array, "refused the call"),
])
def test_checks_reject(name, wrong, hint):
    expect_failure(getattr(check, name), wrong, match=hint)
