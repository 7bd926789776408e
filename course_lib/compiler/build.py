"""Building the program: from a captured graph to the replay (replay.py).

`build` turns a captured graph into a `Program` in four steps, each a function of its own:

1. `prune`: drop the nodes whose values nobody needs;
2. `schedule`: fuse (fuse.py) and give each group one launch (launches.py: a generated kernel, a BLAS
   product, a numpy call with `out=`, an island), in the order the groups start;
3. `plan_memory`: place every value (plan.py): in one arena per dtype, or in the memory the step's objects
   already hold (a parameter, a gradient, an optimizer's moment: `pinned`, so the objects see the new
   values), or in the compiled step's own input buffers;
4. `write_replay`: the replay function's source, one line per launch, with every array bound once.

The replay is then the launches and nothing else: no Function, no autograd walk, no backend dispatch, no
allocation (numpy's calls write into the planned views). Only islands run library Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from course_lib.compiler.fuse import FULL, group_nodes
from course_lib.compiler.ir import CONST, INPUT, SCRATCH, STATE, TEMP, Ref, shaped
from course_lib.compiler.launches import Launch, bind, make_launch
from course_lib.compiler.plan import lifetimes, place
from course_lib.compiler.replay import Program
from course_lib.compiler.trace import Unsupported, tensors_in
from course_lib.tensor.tensor_data import TensorData


def build(graph, rule, pointwise, parallel_min=1 << 17, threads=1):
    """The Program of a captured graph: prune, schedule, plan the memory, write the replay.

    rule: the fusion rule, can_join(group, node); pointwise: the generator of a pointwise group's loop."""
    nodes, keep = prune(graph)
    launches = schedule(nodes, keep, rule, pointwise)
    memory = plan_memory(graph, launches, keep)
    replay, source = write_replay(memory.launches, memory.arrays, graph.buffers, parallel_min, threads)
    _rebind_contexts(nodes, graph, memory.arrays)
    program = Program(graph, memory.launches, memory.arrays, source, memory.placement, memory.naive,
                      memory.finals, _installs(graph, memory))
    program.replay, program.arenas = replay, memory.arenas
    _forget_capture(graph, memory.arrays)
    return program


# ---- 1. prune ----------------------------------------------------------------------------------------


@dataclass
class Keep:
    """The values that must outlive the step: what the step's objects and its result hold (`values`), and
    what a backward island keeps in the capture's own context (`contexts`: pinned, never moved)."""
    values: set
    contexts: set

    @property
    def all(self):
        return self.values | self.contexts


def prune(graph):
    """The nodes something needs, and what must outlive the step (see Keep)."""
    values = {s.after.buffer.id for s in graph.slots if s.after is not None and s.after.buffer.kind in (TEMP, SCRATCH)}
    values |= {r.buffer.id for r in _refs_in(graph.result)}
    held = set()
    for node in graph.nodes:
        if node.kind == "island" and node.attrs["phase"] == "backward" and node.attrs.get("forward") is None:
            held |= {id(t.data.storage) for t in tensors_in(node.attrs["ctx"], [])}
    by_storage = {id(b.array): b for b in graph.buffers}
    contexts = {by_storage[s].id for s in held if s in by_storage and by_storage[s].kind in (TEMP, SCRATCH)}
    keep = Keep(values, contexts)
    return _without_needless_fills(live_nodes(graph, keep.all)), keep


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



# ---- 2. schedule ------------------------------------------------------------------------------------


def schedule(nodes, keep, rule, pointwise):
    """One launch per group of the rule's grouping, in the order the groups start. Each launch writes out
    the values read outside its group: by another launch, by a backward island's replayed forward, or
    after the step (keep)."""
    groups = group_nodes(nodes, rule)
    group_of = {n.id: g for g in groups for n in g.nodes}
    read_outside = set(keep.all)
    for node in nodes:
        for ref in node.inputs:
            p = ref.buffer.producer
            if p is not None and group_of.get(p.id) is not group_of[node.id]:
                read_outside.add(ref.buffer.id)
        forward = node.attrs.get("forward")   # a backward island runs its forward island's op again
        if forward is not None:
            read_outside |= {r.buffer.id for r in forward.inputs}
    return [make_launch(g, read_outside, pointwise) for g in groups]


# ---- 3. the memory plan ---------------------------------------------------------------------------------


@dataclass
class Memory:
    """Where every buffer lives at replay (`arrays`: buffer id -> a flat array), and how it was decided."""
    arrays: dict
    launches: list      # the schedule's, then a copy per carried state that could not be written in place
    finals: list        # (temp id, state id) of those copies
    carried: dict       # state id -> the buffer its places hold after the step
    placement: dict     # dtype -> plan.Placement of the arena
    arenas: dict        # dtype -> the arena
    naive: int          # bytes of one buffer per value, as the eager step allocates them


def plan_memory(graph, launches, keep):
    """Give every buffer its memory: inputs, constants and state where they are; the new state a step
    leaves in its objects (pinned), written in place where the launch that makes it may, else copied back
    at the end; every other value a place in one arena per dtype, shared by values that are never alive
    at once."""
    used = {b for launch in launches for b in launch.inputs}
    carried = _carried(graph, used)
    launches = list(launches)
    pinned = set(keep.contexts) | {slot.after.buffer.id for slot in graph.slots
                                   if slot.after is not None and slot.after.buffer.kind in (TEMP, SCRATCH)}
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
    arrays = {}
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
    buffers = {b.id: b for b in graph.buffers}
    spans = lifetimes(launches, keep=keep.values)
    sizes, naive = {}, 0
    for b_id in spans:
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
    return Memory(arrays, launches, finals, carried, placement, arenas, naive)


# ---- 4. the replay's source -----------------------------------------------------------------------------


def write_replay(launches, arrays, buffers, parallel_min, threads):
    """The replay function and its source: one line per launch, every array and callable bound once in its
    scope (launches.bind; kernels are compiled here, or found in the cache)."""
    names, scope = {}, {"np": np}
    buffers = {b.id: b for b in buffers}
    lines = ["def replay():"]
    for k, launch in enumerate(launches):
        launch.text = bind(launch, k, arrays, names, scope, buffers, parallel_min, threads)
        comment = launch.describe() if launch.group is not None else "state, back into the objects' memory"
        lines.append(f"    {launch.text}  # {comment}")
    if len(lines) == 1:
        lines.append("    pass")
    source = "\n".join(lines) + "\n"
    exec(compile(source, "<compiled step>", "exec"), scope)
    return scope["replay"], source


# ---- what the steps share ------------------------------------------------------------------------------


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


def _rebind_contexts(nodes, graph, arrays):
    """A backward island keeps the capture's ctx: its tensors must see the replay's memory."""
    by_storage = {id(b.array): b for b in graph.buffers if b.array is not None}
    for node in nodes:
        if node.kind == "island" and node.attrs["phase"] == "backward" and node.attrs.get("forward") is None:
            for t in tensors_in(node.attrs["ctx"], []):
                buf = by_storage.get(id(t.data.storage))
                memory = arrays.get(buf.id) if buf is not None else None
                if memory is not None and memory is not t.data.storage:
                    t.data = TensorData(memory, t.data.shape, t.data.strides, t.data.offset)


def _installs(graph, memory):
    """For each place the step's objects keep: (slot, what it must hold before each replay, whether the
    program reads what it held before, so that a value the user put there is copied in)."""
    used = {b for launch in memory.launches for b in launch.inputs}
    persistent = {t.id: memory.arrays[s_id] for s_id, t in memory.carried.items()}   # carried state, between calls
    installs = []
    for slot in graph.slots:
        if slot.after is None:
            continue
        b = slot.after.buffer
        place = persistent.get(b.id, memory.arrays.get(b.id, b.array))
        td = TensorData(place, slot.after.view.shape, slot.after.view.strides, slot.after.view.offset)
        td = slot.get() if slot.get() is not None and _same_memory(slot.get(), td) else td
        watched = slot.before is not None and slot.before.buffer.id in used
        installs.append((slot, td, watched))
    return installs


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
