"""Building the program: from a captured graph to the replay (replay.py).

`build` turns a captured graph into a `Program`:

1. drop the nodes whose values nobody needs;
2. fuse (fuse.py): each group becomes one launch (launches.py: a generated kernel, a BLAS product, a
   numpy call with `out=`, an island);
3. place every value (plan.py): in one arena per dtype, or in the memory the step's objects already hold
   (a parameter, a gradient, an optimizer's moment: `pinned`, so the objects see the new values), or in
   the compiled step's own input buffers;
4. write the replay function's source, one line per launch, with every array bound once.

The replay is then the launches and nothing else: no Function, no autograd walk, no backend dispatch, no
allocation (numpy's calls write into the planned views). Only islands run library Python.
"""

from __future__ import annotations

import numpy as np

from course_lib.compiler.codegen import pointwise_source
from course_lib.compiler.fuse import FULL, can_join, group_nodes
from course_lib.compiler.ir import CONST, INPUT, SCRATCH, STATE, TEMP, Ref, shaped
from course_lib.compiler.launches import Launch, bind, make_launch
from course_lib.compiler.plan import lifetimes, place
from course_lib.compiler.replay import Program
from course_lib.compiler.trace import Unsupported, tensors_in
from course_lib.tensor.tensor_data import TensorData


def build(graph, rule=can_join, pointwise=pointwise_source, parallel_min=1 << 17, threads=1):
    """The Program of a captured graph (see the module's docstring)."""
    keep = {s.after.buffer.id for s in graph.slots if s.after is not None and s.after.buffer.kind in (TEMP, SCRATCH)}
    keep |= {r.buffer.id for r in _refs_in(graph.result)}
    ctx_pins = set()
    for node in graph.nodes:
        if node.kind == "island" and node.attrs["phase"] == "backward" and node.attrs.get("forward") is None:
            ctx_pins |= {id(t.data.storage) for t in tensors_in(node.attrs["ctx"], [])}
    by_storage = {id(b.array): b for b in graph.buffers}
    ctx_pins = {by_storage[s].id for s in ctx_pins if s in by_storage and by_storage[s].kind in (TEMP, SCRATCH)}
    nodes = _without_needless_fills(live_nodes(graph, keep | ctx_pins))
    buffers = {b.id: b for b in graph.buffers}
    groups = group_nodes(nodes, rule)
    group_of = {n.id: g for g in groups for n in g.nodes}
    read_outside = set(keep) | ctx_pins
    for node in nodes:
        for ref in node.inputs:
            p = ref.buffer.producer
            if p is not None and group_of.get(p.id) is not group_of[node.id]:
                read_outside.add(ref.buffer.id)
        for key in ("forward",):
            if node.attrs.get(key) is not None:
                read_outside |= {r.buffer.id for r in node.attrs[key].inputs}

    launches = [make_launch(g, read_outside, pointwise) for g in groups]
    used = {b for launch in launches for b in launch.inputs}
    carried = _carried(graph, used)

    # where each buffer lives
    arrays, pinned = {}, set(ctx_pins)
    for slot in graph.slots:
        if slot.after is not None and slot.after.buffer.kind in (TEMP, SCRATCH):
            pinned.add(slot.after.buffer.id)
    writer = {b: k for k, launch in enumerate(launches) for b in launch.outputs}
    finals = []
    for s_id, t in carried.items():
        if t.id == s_id:
            continue
        w = writer.get(t.id)
        readers = [k for k, launch in enumerate(launches) if s_id in launch.inputs]
        in_place = w is not None and all(k < w for k in readers if k != w) and (
            w not in readers or _reads_in_place(launches[w], s_id, t.id))
        if not in_place:  # written elsewhere, copied into the objects' memory at the end
            pinned.discard(t.id)
            finals.append((t.id, s_id))
    for b in graph.buffers:
        if b.kind == INPUT:
            arrays[b.id] = b.array
        elif b.kind == CONST:
            arrays[b.id] = b.value
        elif b.kind == STATE:
            t = carried.get(b.id)
            arrays[b.id] = b.array if t is None or t.id == b.id else t.array
        elif b.id in pinned:
            arrays[b.id] = b.array
    for t_id, s_id in finals:
        launch = Launch("copy", None, [t_id], [s_id])
        launch.final = (t_id, s_id)
        launches.append(launch)
    # the arena: every other value a launch writes
    spans = lifetimes(launches, keep=keep)
    sizes, naive = {}, 0
    for b_id, span in spans.items():
        b = buffers[b_id]
        if b.kind in (TEMP, SCRATCH):
            naive += b.size * b.dtype.itemsize
        if b_id not in arrays:
            sizes.setdefault(b.dtype.name, {})[b_id] = b.size
    placement, arenas = {}, {}
    for dtype, group_sizes in sizes.items():
        p = place(group_sizes, {k: spans[k] for k in group_sizes})
        arena = arenas[dtype] = np.zeros(max(p.size, 1), dtype=dtype)
        for b_id, offset in p.offsets.items():
            arrays[b_id] = arena[offset:offset + buffers[b_id].size]
        placement[dtype] = p
    for b_id in used:
        if b_id not in arrays:
            raise Unsupported(f"buffer {buffers[b_id].label()} is read but nothing writes it")

    names, scope = {}, {"np": np}
    lines = ["def replay():"]
    for k, launch in enumerate(launches):
        launch.text = bind(launch, k, arrays, names, scope, buffers, parallel_min, threads)
        comment = launch.describe() if launch.group is not None else "state, back into the objects' memory"
        lines.append(f"    {launch.text}  # {comment}")
    if len(lines) == 1:
        lines.append("    pass")
    source = "\n".join(lines) + "\n"
    exec(compile(source, "<compiled step>", "exec"), scope)
    for node in nodes:   # a backward island keeps the capture's ctx: its tensors must see the replay's memory
        if node.kind == "island" and node.attrs["phase"] == "backward" and node.attrs.get("forward") is None:
            for t in tensors_in(node.attrs["ctx"], []):
                buf = by_storage.get(id(t.data.storage))
                memory = arrays.get(buf.id) if buf is not None else None
                if memory is not None and memory is not t.data.storage:
                    t.data = TensorData(memory, t.data.shape, t.data.strides, t.data.offset)
    installs = []
    persistent = {t.id: arrays[s_id] for s_id, t in carried.items()}   # where carried state lives between calls
    for slot in graph.slots:   # the places the step's objects keep: what they must hold before each replay
        if slot.after is None:
            continue
        b = slot.after.buffer
        memory = persistent.get(b.id, arrays.get(b.id, b.array))
        td = TensorData(memory, slot.after.view.shape, slot.after.view.strides, slot.after.view.offset)
        td = slot.get() if slot.get() is not None and _same_memory(slot.get(), td) else td
        watched = slot.before is not None and slot.before.buffer.id in used
        installs.append((slot, td, watched))
    program = Program(graph, launches, arrays, source, placement, naive, finals, installs)
    program.replay, program.arenas = scope["replay"], arenas
    _forget_capture(graph, arrays)
    return program



def live_nodes(graph, keep):
    """The nodes something needs: a value in `keep` or read by a needed node (scratch: all its writers)."""
    live, needed = [], set(keep)
    for node in reversed(graph.nodes):
        outs = [node.out] + [r for r in node.attrs.get("outs", []) if r is not None]
        if any(r is not None and r.buffer.id in needed for r in outs):
            live.append(node)
            needed |= {r.buffer.id for r in node.inputs}
    live.reverse()
    return live



def _without_needless_fills(nodes):
    """The nodes without the zero fills of scratch buffers that the writes after them cover entirely
    (an optimizer's flat gradient, made by `cat`): the zeros would all be written over."""
    out = []
    for node in nodes:
        if node.kind == "fill":
            buf = node.out.buffer
            writes = [n for n in nodes if n.attrs.get("into") and n.out.buffer is buf]
            covered = np.zeros(buf.size, dtype=bool)
            positions = np.arange(buf.size)
            for w in writes:
                covered[shaped(positions, w.out.view).reshape(-1)] = True
            if covered.all():
                for w in writes:
                    if w.attrs.get("after") is node:
                        w.attrs["after"] = None
                continue
        out.append(node)
    return out



def _carried(graph, used):
    """For each state buffer the step reads: the buffer its places hold after the step (itself if unchanged)."""
    out = {}
    for slot in graph.slots:
        if slot.before is None or slot.before.buffer.id not in used:
            continue
        s = slot.before.buffer
        after = slot.after
        if after is None or after.view != slot.before.view:
            raise Unsupported(f"the step leaves {slot.name} in another layout than it found it "
                              f"({slot.before.view} -> {after.view if after else None})")
        if out.setdefault(s.id, after.buffer) is not after.buffer:
            raise Unsupported(f"the places that shared {s.label()} ({', '.join(s.origin)}) hold different buffers after the step")
    return out



def _reads_in_place(launch, s_id, t_id):
    """Whether the launch that writes t may write it over s, in place: it reads s only at the element it
    writes. A lone numpy call may; so may a kernel without reductions whose loads of s are FULL, which is
    then written block by block (codegen.blocked_source: LLVM vectorizes a loop only after checking at
    run time that its outputs do not overlap its inputs, and an update in place overlaps)."""
    if launch.kind == "ufunc":
        node = launch.nodes[0]
        return all(r.view == node.out.view for r in node.inputs if r.buffer.id == s_id)
    if launch.kind == "kernel" and launch.kernel.is_pointwise() and all(st.op != "one_hot" for st in launch.kernel.steps):
        loads = [ld for ld in launch.kernel.loads if ld.ref.buffer.id == s_id]
        if all(ld.kind == FULL and ld.ref.view.offset == 0 for ld in loads):
            launch.in_place = True
            return True
    return False



def _same_memory(a, b):
    return a.storage is b.storage or (a.storage.__array_interface__["data"][0] == b.storage.__array_interface__["data"][0]
                                      and a.shape == b.shape and a.strides == b.strides and a.offset == b.offset)



def _forget_capture(graph, arrays):
    """Let go of the capture's memory that the program does not use."""
    for b in graph.buffers:
        if b.id not in arrays and b.kind in (TEMP, SCRATCH):
            b.array = None



def _refs_in(value):
    if isinstance(value, Ref):
        return [value]
    if isinstance(value, (tuple, list)):
        return [r for v in value for r in _refs_in(v)]
    if isinstance(value, dict):
        return [r for v in value.values() for r in _refs_in(v)]
    return []
