"""Launches: what each fused group becomes in the replay, and its line of the replay's source.

A group of several nodes, or one node numpy has no single call for, becomes a generated kernel
(lower.py, codegen.py, kernels.py); a product is BLAS's, through numpy's matmul with `out=`, as in the eager step; a
lone elementwise op or reduction is numpy's own call with `out=` (the very call the eager numpy backend
makes); a copy is `np.copyto`; the embedding's gather and scatter-add are index.py's kernels; an island
calls its op's Python on the replay's memory. `bind` names every array a launch reads or writes once, in
the replay's scope, and returns the launch's line.
"""

from __future__ import annotations

import numpy as np

from course_lib.compiler import index, kernels
from course_lib.compiler.codegen import blocked_source, general_arguments, generate
from course_lib.compiler.ir import shaped
from course_lib.compiler.lower import describe
from course_lib.compiler.trace import describe_where
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



def make_launch(group, read_outside, pointwise):
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



def bind(launch, k, arrays, names, scope, buffers, parallel_min, threads):
    """Bind the launch's arrays and callable into the replay's scope; return its line of source."""

    def name_of(ref, flat=False):
        """A name for the ref's memory: as a shaped view, or flat from the view's start (`flat`), or flat and
        exactly the view's elements (flat="exact", for a contiguous view)."""
        key = (ref.buffer.id, ref.view, flat)
        if key not in names:
            array, start = arrays[ref.buffer.id], ref.view.offset
            names[key] = f"v{len(names)}"
            scope[names[key]] = (array[start:start + ref.view.size] if flat == "exact" else array[start:] if flat
                                 else shaped(array, ref.view))
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
    outs = [None if r is None or not m else shaped(arrays[r.buffer.id], r.view)
            for r, m in zip(node.attrs["outs"], node.attrs["made"])]
    holder = node.attrs.setdefault("replay_ctx", [None])
    if phase == "forward":
        needs = node.attrs["ctx"].needs_grad if node.attrs.get("ctx") is not None else ()
        kwargs = {k: _kwarg(v, arrays) for k, v in node.attrs["kwargs"].items()}

        def run():
            ctx = Context(fn.__name__, needs)
            td = fn.forward(ctx, *tensors, **kwargs)
            holder[0] = ctx
            if outs[0] is not None:   # None: its result is a view of memory it was given, already in place
                np.copyto(outs[0], td.to_numpy())
        return run
    forward = node.attrs.get("forward")
    capture_ctx = node.attrs["ctx"]
    grad = tensors[0]
    refreshed = {k: _kwarg(v, arrays) for k, v in node.attrs.get("ctx_inputs", {}).items() if v[0] == "input"}

    def run_backward():
        ctx = forward.attrs["replay_ctx"][0] if forward is not None else capture_ctx
        for key, value in refreshed.items():   # this call's index arrays, where the capture's were
            setattr(ctx, key, value)
        grads = fn.backward(ctx, grad)
        grads = grads if isinstance(grads, tuple) else (grads,)
        for out, g in zip(outs, grads):
            if out is not None and g is not None:
                np.copyto(out, g.data.to_numpy())
    return run_backward



def _kwarg(value, arrays):
    what, item = value[0], value[1]
    if what == "input":
        return shaped(arrays[item.buffer.id], item.view)
    return item
