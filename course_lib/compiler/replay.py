"""Replay: the compiled step, one generated Python function that makes the step's calls in order.

`build` turns a captured graph into a `Program`:

1. drop the nodes whose values nobody needs;
2. fuse (fuse.py): each group becomes one launch. A group of several nodes, or one node numpy has no
   single call for, becomes a generated kernel (codegen.py, kernels.py); a product is BLAS's, through
   numpy's matmul, as in the eager step; a lone elementwise op or reduction is numpy's own call, with
   `out=` (the very call the eager numpy backend makes); an island calls its op's Python;
3. place every value (plan.py): in one arena per dtype, or in the memory the step's objects already hold
   (a parameter, a gradient, an optimizer's moment: `pinned`, so the objects see the new values), or in
   the compiled step's own input buffers;
4. write the replay function's source, one line per launch, with every array bound once.

The replay is then the launches and nothing else: no Function, no autograd walk, no backend dispatch, no
allocation (numpy's calls write into the planned views). Only islands run library Python.
"""

from __future__ import annotations

import numpy as np

from course_lib.compiler import index, kernels
from course_lib.compiler.codegen import blocked_source, describe, general_arguments, generate, pointwise_source
from course_lib.compiler.fuse import FULL, can_join, group_nodes
from course_lib.compiler.ir import CONST, INPUT, SCRATCH, STATE, TEMP
from course_lib.compiler.plan import lifetimes, place
from course_lib.compiler.trace import Unsupported, _tensors_in, describe_where
from course_lib.tensor import Tensor
from course_lib.tensor.autodiff import Context
from course_lib.tensor.tensor_data import TensorData

# lone ops that are one numpy call with out= (the numpy backend's own calls)
UFUNC = {"add": "np.add", "sub": "np.subtract", "mul": "np.multiply", "div": "np.divide", "pow": "np.power",
         "max": "np.maximum", "neg": "np.negative", "exp": "np.exp", "log": "np.log", "sqrt": "np.sqrt",
         "inv": "np.reciprocal", "tanh": "np.tanh", "eq": "np.equal", "ne": "np.not_equal", "lt": "np.less",
         "le": "np.less_equal", "gt": "np.greater", "ge": "np.greater_equal"}
COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}
REDUCE_UFUNC = {"sum": "np.add.reduce", "max": "np.maximum.reduce"}


class Launch:
    """One call of the replay: what it reads and writes (buffer ids), and its line of the source."""

    def __init__(self, kind, group, inputs, outputs):
        self.kind, self.group = kind, group
        self.inputs, self.outputs = inputs, outputs   # buffer ids (plan.lifetimes reads these names)
        self.text = ""
        self.kernel = None      # the Kernel description, for generated kernels
        self.source = ""        # the kernel's module text
        self.call = None        # what the line calls (kernel function, island closure)

    @property
    def nodes(self):
        return self.group.nodes

    def describe(self):
        """'LayerNorm.forward: reduce sum, zip div, ... (model.py:80)' for comments and messages."""
        scopes = []
        for n in self.nodes:
            if n.scope and n.scope not in scopes:
                scopes.append(n.scope)
        ops = ", ".join(n.label() for n in self.nodes[:6]) + (f", ... ({len(self.nodes)} ops)" if len(self.nodes) > 6 else "")
        where = describe_where(self.nodes[0].where[:1]).split(": `")[0] if self.nodes[0].where else ""
        return f"{'+'.join(scopes[:3]) or self.kind}: {ops}" + (f" [{where}]" if where else "")


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


class Program:
    """A compiled step: call run(args) with the step's arguments (guards are the caller's business)."""

    def __init__(self, graph, launches, arrays, source, placement, naive_bytes, finals, installs):
        self.graph, self.launches, self.arrays, self.source = graph, launches, arrays, source
        self.placement, self.naive_bytes = placement, naive_bytes
        self.finals, self.installs = finals, installs
        self.calls = 0

    @property
    def kernels(self):
        return [launch for launch in self.launches if launch.kind == "kernel"]

    def counts(self):
        out = {}
        for launch in self.launches:
            out[launch.kind] = out.get(launch.kind, 0) + 1
        return out

    def arena_bytes(self):
        return sum(p.size * np.dtype(d).itemsize for d, p in self.placement.items())

    def run(self, args):
        for k, buf in enumerate(self.graph.inputs):        # the arguments, into the step's input buffers
            if buf is not None:
                value = args[k].data.to_numpy() if isinstance(args[k], Tensor) else np.asarray(args[k])
                np.copyto(buf.array.reshape(np.shape(value)), value, casting="unsafe")
        for slot, td, watched in self.installs:             # state changed outside the step: take it in
            now = slot.get()
            if now is not td:
                if watched and now is not None:
                    np.copyto(td.to_numpy(), now.to_numpy())
                _install(slot, td)
        with np.errstate(all="ignore"):
            try:
                self.replay()
            except Exception as e:
                raise self._failure(e) from e
        self.calls += 1
        return _result(self.graph.result, self.arrays)

    def _failure(self, error):
        """The launch that raised, with its group and (for a kernel) its source."""
        tb = error.__traceback__
        line = None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == "<compiled step>":
                line = tb.tb_lineno
            tb = tb.tb_next
        if line is None or not 2 <= line < len(self.launches) + 2:
            return error
        launch = self.launches[line - 2]
        text = f"\n{kernels.numbered(launch.source)}" if launch.source else ""
        return kernels.KernelError(f"launch {line - 2} of the compiled step failed: {type(error).__name__}: {error}\n"
                                   f"  group: {launch.describe()}\n  call: {launch.text}{text}")


def _install(slot, td):
    """Make the place hold `td` again (the compiled step's memory)."""
    if slot.how == "data":
        slot.owner.data = td
    elif slot.how == "grad":
        slot.owner.grad = Tensor._wrap(td)
    elif slot.how == "item":
        slot.owner[slot.key] = Tensor._wrap(td)
    else:
        setattr(slot.owner, slot.key, Tensor._wrap(td))


def _result(template, arrays):
    from course_lib.compiler.ir import Ref
    if isinstance(template, Ref):
        view = _shaped(arrays[template.buffer.id], template.view)
        return Tensor._wrap(TensorData.contiguous(np.array(view).reshape(-1), tuple(template.view.shape)))
    if isinstance(template, (tuple, list)):
        return type(template)(_result(t, arrays) for t in template)
    if isinstance(template, dict):
        return {k: _result(v, arrays) for k, v in template.items()}
    return template


def _shaped(array, view):
    """The view of a flat array as a numpy array (no copy)."""
    item = array.itemsize
    return np.lib.stride_tricks.as_strided(array[view.offset:], view.shape, tuple(s * item for s in view.strides))


# ---- building ----------------------------------------------------------------------------------------------

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


def build(graph, rule=can_join, pointwise=pointwise_source, parallel_min=1 << 17, threads=1):
    """The Program of a captured graph (see the module's docstring)."""
    keep = {s.after.buffer.id for s in graph.slots if s.after is not None and s.after.buffer.kind in (TEMP, SCRATCH)}
    keep |= {r.buffer.id for r in _refs_in(graph.result)}
    ctx_pins = set()
    for node in graph.nodes:
        if node.kind == "island" and node.attrs["phase"] == "backward" and node.attrs.get("forward") is None:
            ctx_pins |= {id(t.data.storage) for t in _tensors_in(node.attrs["ctx"], [])}
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

    launches = [_launch(g, read_outside, pointwise) for g in groups]
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
        launch.text = _bind(launch, k, arrays, names, scope, buffers, parallel_min, threads)
        comment = launch.describe() if launch.group is not None else "state, back into the objects' memory"
        lines.append(f"    {launch.text}  # {comment}")
    if len(lines) == 1:
        lines.append("    pass")
    source = "\n".join(lines) + "\n"
    exec(compile(source, "<compiled step>", "exec"), scope)
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
                covered[_shaped(positions, w.out.view).reshape(-1)] = True
            if covered.all():
                for w in writes:
                    if w.attrs.get("after") is node:
                        w.attrs["after"] = None
                continue
        out.append(node)
    return out


def _same_memory(a, b):
    return a.storage is b.storage or (a.storage.__array_interface__["data"][0] == b.storage.__array_interface__["data"][0]
                                      and a.shape == b.shape and a.strides == b.strides and a.offset == b.offset)


def _forget_capture(graph, arrays):
    """Let go of the capture's memory that the program does not use."""
    for b in graph.buffers:
        if b.id not in arrays and b.kind in (TEMP, SCRATCH):
            b.array = None


def _refs_in(value):
    from course_lib.compiler.ir import Ref
    if isinstance(value, Ref):
        return [value]
    if isinstance(value, (tuple, list)):
        return [r for v in value for r in _refs_in(v)]
    if isinstance(value, dict):
        return [r for v in value.values() for r in _refs_in(v)]
    return []


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


def _launch(group, read_outside, pointwise):
    """The launch of one group: what kind of call, what it reads and writes."""
    nodes = group.nodes
    node = nodes[0]
    outputs = []
    for n in nodes:
        for r in [n.out] + n.attrs.get("outs", []):
            if r is not None and r.buffer.id in read_outside and r.buffer.id not in outputs:
                outputs.append(r.buffer.id)
    if len(nodes) == 1:  # a lone op writes all it makes
        outs = node.attrs.get("outs", [])
        made = node.attrs.get("made", [True] * len(outs))
        outputs = [r.buffer.id for r in [node.out] if r is not None and node.kind != "island"]
        outputs += [r.buffer.id for r, m in zip(outs, made) if r is not None and m]
        outputs = list(dict.fromkeys(outputs))
    inputs = []
    for n in nodes:
        for r in n.inputs:
            p = r.buffer.producer
            if (p is None or p not in group) and r.buffer.id not in inputs:
                inputs.append(r.buffer.id)
        if n.attrs.get("into") and n.attrs.get("after") is not None:
            inputs.append(n.out.buffer.id)   # it writes into memory others wrote first: it comes after them
    kind = _lone_kind(node) if len(nodes) == 1 else "kernel"
    launch = Launch(kind, group, inputs, outputs)
    if kind == "kernel":
        launch.kernel = describe(group, set(read_outside))
        launch.pointwise = pointwise
    return launch


def _lone_kind(node):
    if node.kind in ("matmul", "fill", "island"):
        return node.kind
    if node.kind in ("gather", "scatter_add"):
        return "index"
    if node.kind == "map" and node.op == "id":
        return "copy"
    if node.kind == "map" and node.op == "relu":
        return "ufunc"
    if node.kind in ("map", "zip") and node.op in UFUNC:
        return "ufunc"
    if node.kind == "reduce":
        return "reduce"
    return "kernel"


def _bind(launch, k, arrays, names, scope, buffers, parallel_min, threads):
    """Bind the launch's arrays and callable into the replay's scope; return its line of source."""

    def name_of(ref, flat=False):
        """A name for the ref's memory: as a shaped view, or flat from the view's start (`flat`), or flat and
        exactly the view's elements (flat="exact", for a contiguous view)."""
        key = (ref.buffer.id, ref.view, flat)
        if key not in names:
            array, start = arrays[ref.buffer.id], ref.view.offset
            names[key] = f"v{len(names)}"
            scope[names[key]] = (array[start:start + ref.view.size] if flat == "exact" else array[start:] if flat
                                 else _shaped(array, ref.view))
        return names[key]

    if launch.group is None:   # a final copy of carried state
        t_id, s_id = launch.final
        scope[f"f{k}"], scope[f"g{k}"] = arrays[t_id], arrays[s_id]
        return f"np.copyto(g{k}, f{k})"
    node = launch.nodes[0]
    if launch.kind == "matmul":
        a, b = node.inputs
        return f"np.matmul({name_of(a)}, {name_of(b)}, out={name_of(node.out)})"
    if launch.kind == "fill":
        return f"{name_of(node.out)}.fill(0)"
    if launch.kind == "index":
        fn = {"gather": index.gather_rows, "scatter_add": index.scatter_add_rows}[node.kind]
        scope[fn.__name__] = fn
        source, idx = node.inputs
        args = [name_of(r, flat="exact") for r in (node.out, source, idx)]
        kernels.compile_for(fn, [scope[a] for a in args] + [node.attrs["width"]], "", node.kind)
        return f"{fn.__name__}({', '.join(args)}, {node.attrs['width']})"
    if launch.kind == "copy":
        return f"np.copyto({name_of(node.out)}, {name_of(node.inputs[0])})"
    if launch.kind == "reduce":
        return (f"{REDUCE_UFUNC[node.op]}({name_of(node.inputs[0])}, axis={node.attrs['dim']}, keepdims=True, "
                f"out={name_of(node.out)})")
    if launch.kind == "ufunc":
        args = ", ".join(name_of(r) for r in node.inputs)
        if node.op == "relu":
            args += ", 0"
        fn = "np.maximum" if node.op == "relu" else UFUNC[node.op]
        cast = ", casting='unsafe'" if node.op in COMPARE else ""
        return f"{fn}({args}, out={name_of(node.out)}{cast})"
    if launch.kind == "island":
        scope[f"island{k}"] = launch.call = _island(node, arrays)
        return f"island{k}()"
    # a generated kernel
    kernel = launch.kernel
    kernel.parallel = threads > 1 and kernel.rows > 1 and np.prod(kernel.shape) >= parallel_min
    source = blocked_source(kernel) if getattr(launch, "in_place", False) else generate(kernel, launch.pointwise)
    reduces = any(s.role != "vec" for s in kernel.steps)
    text = kernels.module_text(source, kernel.parallel, reduces)
    launch.source = text
    group = launch.group
    out_refs = []
    for name in kernel.stores:
        step_index = int(name[1:])
        out_refs.append(group.nodes[step_index].out)
    args = [name_of(r, flat=True) for r in out_refs] + [name_of(ld.ref, flat=True) for ld in kernel.loads]
    extra = []
    for j, value in enumerate(general_arguments(kernel)):
        if isinstance(value, int):
            extra.append(str(value))
        else:
            scope[f"d{k}_{j}"] = value
            extra.append(f"d{k}_{j}")
    call_args = args + [str(kernel.rows), str(kernel.n)] + extra
    fn = kernels.load(text, launch.describe())
    sample = [scope[a] for a in args] + [kernel.rows, kernel.n] + [scope[e] if e in scope else int(e) for e in extra]
    kernels.compile_for(fn, sample, text, launch.describe())
    scope[f"k{k}"] = launch.call = fn
    return f"k{k}({', '.join(call_args)})"


def _island(node, arrays):
    """A closure that runs the island's op with the replay's memory (see trace.Tracer.close)."""
    fn, phase = node.attrs["fn"], node.attrs["phase"]
    count = node.attrs["tensors"]
    tensors = [Tensor._wrap(TensorData(arrays[r.buffer.id], r.view.shape, r.view.strides, r.view.offset))
               for r in node.inputs[:count]]
    outs = [None if r is None or not m else _shaped(arrays[r.buffer.id], r.view)
            for r, m in zip(node.attrs["outs"], node.attrs["made"])]
    holder = node.attrs.setdefault("replay_ctx", [None])
    if phase == "forward":
        needs = node.attrs["ctx"].needs_grad if node.attrs.get("ctx") is not None else ()
        kwargs = {k: _kwarg(v, arrays) for k, v in node.attrs["kwargs"].items()}

        def run():
            ctx = Context(fn.__name__, needs)
            td = fn.forward(ctx, *tensors, **kwargs)
            holder[0] = ctx
            np.copyto(outs[0], td.to_numpy())
        return run
    forward = node.attrs.get("forward")
    capture_ctx = node.attrs["ctx"]
    grad = tensors[0]

    def run_backward():
        ctx = forward.attrs["replay_ctx"][0] if forward is not None else capture_ctx
        grads = fn.backward(ctx, grad)
        grads = grads if isinstance(grads, tuple) else (grads,)
        for out, g in zip(outs, grads):
            if out is not None and g is not None:
                np.copyto(out, g.data.to_numpy())
    return run_backward


def _kwarg(value, arrays):
    what, item = value[0], value[1]
    if what == "input":
        return _shaped(arrays[item.buffer.id], item.view)
    return item
