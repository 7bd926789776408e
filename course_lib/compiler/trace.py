"""Capture: run a step once, eagerly, and write down every op it makes.

Two declared plug-in points of chapter 02's library do the watching:

- a backend (`register_backend`). Every number the step computes -- its forward, each backward rule, the
  optimizer's formulas -- comes out of a backend call (map, zip, where, reduce, matmul). The tracing
  backend runs each call on the real backend, for the real values, and records it.
- an op mode (`autodiff.op_mode`). It sees each library op (a Function) begin and end, and each value
  that leaves for Python (`.item()`, `.numpy()`). So the tracer knows which op asked for a call (for the
  pictures and the messages), notices an op that works outside the backend (it reads values with
  numpy, or makes a tensor from numpy: it becomes an island, run by Python at replay), and notices
  Python reading a value in the middle of the step (a graph break, named by its line).

The step's objects are read before and after the call: each place that holds a tensor (a parameter's
data and grad, the optimizer's moments) is a `Slot`, so the graph knows what the step reads from them
and what it leaves in them.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import types

import numpy as np

from course_lib.capstone import functions as capstone_functions
from course_lib.compiler.ir import CONST, INPUT, SCRATCH, STATE, TEMP, Buffer, Graph, Node, Ref, Slot, View
from course_lib.tensor import OPS, Tensor, autodiff, nn, optim
from course_lib.tensor import functions as F
from course_lib.tensor.backend import Backend, current_backend, registered_backend, use_backend
from course_lib.tensor.tensor_data import TensorData


class Unsupported(RuntimeError):
    """The step does something the compiler cannot capture; the message says what and where."""


# ---- where an op came from --------------------------------------------------------------------------

_HERE = os.path.dirname(os.path.abspath(__file__))


def _core_files(module, package="course_lib.tensor."):
    """The files of `module` and of every module of `package` it reaches through its names, at any depth.
    From tensor.py: autodiff, the op registry and its Functions, TensorData, the backend interface, the
    scalar ops -- the plumbing an op passes through between the line that asked for it and its backend
    call. The modules written with ops (nn.py's layers, optim.py's optimizers) are not reached, so a
    message names their lines."""
    todo, seen = [module], {}
    while todo:
        m = todo.pop()
        if m.__name__ in seen:
            continue
        seen[m.__name__] = os.path.abspath(m.__file__)
        for value in vars(m).values():
            if not isinstance(value, types.ModuleType):
                value = sys.modules.get(getattr(value, "__module__", None) if isinstance(value, type) or
                                        inspect.isfunction(value) else type(value).__module__)
            if value is not None and value.__name__.startswith(package):
                todo.append(value)
    return set(seen.values())


_PLUMBING = _core_files(sys.modules["course_lib.tensor.tensor"])


def _is_plumbing(filename):
    return filename in _PLUMBING or (filename.startswith(_HERE) and not filename.endswith("capturable.py"))


def where_from(depth=2, frames=2):
    """((file, line, function), ...) of the first frame outside the library's plumbing, then of the first
    frames after it in other files (its callers), `frames` in all."""
    found, frame = [], sys._getframe(depth)
    while frame is not None and len(found) < frames:
        code = frame.f_code
        if not _is_plumbing(os.path.abspath(code.co_filename)) and \
                (not found or code.co_filename != found[-1][0]):
            found.append((code.co_filename, frame.f_lineno, _function_of(code)))
        frame = frame.f_back
    return tuple(found)


def _function_of(code):
    """The name of the function a line is in: for a generator expression or a comprehension
    (`<genexpr>`), the function that holds it (its qualified name says which: `f.<locals>.<genexpr>`)."""
    if not code.co_name.startswith("<") or code.co_name == "<module>":
        return code.co_name
    named = [part for part in code.co_qualname.split(".<locals>.") if not part.startswith("<")]
    return named[-1].rsplit(".", 1)[-1] if named else code.co_name


def describe_where(where):
    """'optim.py:137 in update: m_hat = m / (1 - b1 ** t)' (and the caller's line, when there is one)."""
    import linecache

    parts = []
    for filename, line, function in where:
        code = linecache.getline(filename, line).strip()
        name = os.path.basename(filename) if not filename.startswith("<") else filename
        parts.append(f"{name}:{line} in {function}" + (f": `{code}`" if code else ""))
    return " (called from ".join(parts) + ")" * (len(parts) - 1) if parts else "an unknown line"


# ---- the places of state --------------------------------------------------------------------------

def find_slots(args):
    """Every place of the arguments' objects that holds a tensor, in a fixed order: each module's
    parameters (their data and grad) and other tensors, each optimizer's parameters, tensor attributes
    and the tensors of its dicts (its state)."""
    slots, seen = [], set()

    def add(owner, key, how, name):
        if (id(owner), key, how) not in seen:
            seen.add((id(owner), key, how))
            slots.append(Slot(owner, key, how, name))

    def tensor(t, name, trained):
        add(t, "data", "data", name)
        if trained:
            add(t, "grad", "grad", name + ".grad")

    for i, arg in enumerate(args):
        if isinstance(arg, nn.Module):
            for name, p in arg.named_parameters():
                tensor(p, name, True)
            for m in arg.modules():
                for attr, value in vars(m).items():
                    if isinstance(value, Tensor) and not isinstance(value, nn.Parameter):
                        tensor(value, f"{type(m).__name__}.{attr}", False)
        elif isinstance(arg, optim.Optimizer):
            for k, p in enumerate(arg.params):
                tensor(p, getattr(p, "name", "") or f"param{k}", True)
            for attr, value in vars(arg).items():
                if isinstance(value, Tensor):
                    add(arg, attr, "attr", f"optimizer.{attr}")
                elif isinstance(value, dict):
                    for key, t in value.items():
                        if isinstance(t, Tensor):
                            add(value, key, "item", f"optimizer.{attr}[{key!r}]")
    return slots


# ---- the tracing backend ----------------------------------------------------------------------------

class TracingBackend(Backend):
    """Runs each call on the backend that was current when the capture began, and records it."""

    name = "compiler-trace"

    def __init__(self):
        self.tracer = None

    def _run(self, kind, op, inputs, out, call, **attrs):
        tracer = self.tracer
        if out is not None:
            buf = tracer.by_storage.get(id(out.storage))
            if buf is None:
                tracer.fill_scratch(out.storage)  # before the call writes into it: zeros, made by the library
            elif buf.kind != SCRATCH:
                raise Unsupported(f"{describe_where(where_from(3))}: a {kind} writes into a view of {buf.kind} memory "
                                  f"({buf.label()}); the compiler only follows writes into zeros made for them")
        result = call()
        if out is None:  # a fresh output, in memory of the tracer's own (so each storage is one buffer)
            result = TensorData.contiguous(np.array(result.to_numpy()).reshape(-1), tuple(result.shape))
        tracer.record(kind, op, inputs, result, into=out is not None, **attrs)
        return result

    def map(self, op, a, out=None):
        return self._run("map", op, (a,), out, lambda: self.tracer.inner.map(op, a, out))

    def zip(self, op, a, b, out=None):
        return self._run("zip", op, (a, b), out, lambda: self.tracer.inner.zip(op, a, b, out))

    def where(self, cond, a, b):
        return self._run("where", "", (cond, a, b), None, lambda: self.tracer.inner.where(cond, a, b))

    def reduce(self, op, a, dim):
        return self._run("reduce", op, (a,), None, lambda: self.tracer.inner.reduce(op, a, dim), dim=dim)

    def matmul(self, a, b):
        return self._run("matmul", "", (a, b), None, lambda: self.tracer.inner.matmul(a, b))


TRACING = TracingBackend()


@contextlib.contextmanager
def tracing(tracer):
    """Inside the block, every backend call and every op goes to `tracer`. The tracing backend is
    registered for the block only, so the library's list of backends is the same before and after."""
    TRACING.tracer = tracer
    try:
        with registered_backend(TRACING.name, TRACING), use_backend(TRACING.name), autodiff.op_mode(tracer):
            yield
    finally:
        TRACING.tracer = None


# ---- the tracer ---------------------------------------------------------------------------------------

def op_name(fn):
    """The name of a library op in the messages and pictures: its class's, or the `label` of a Function that
    stands in for a registry op (chapter 12's assembly names each adapter by the op it runs: "MatMul")."""
    return getattr(fn, "label", None) or fn.__name__


class Scope:
    """A library op being watched: its Function, forward or backward, and what it was given."""

    def __init__(self, fn, phase, start, tensors, kwargs=None, ctx=None):
        self.fn, self.phase, self.start = fn, phase, start
        self.tensors, self.kwargs, self.ctx = tensors, kwargs or {}, ctx
        self.reads = False

    @property
    def name(self):
        return f"{op_name(self.fn)}.{self.phase}"


def tensors_in(value, out, depth=0):
    """The tensors held by a value (a Tensor, a tuple or list of them, a context's attributes)."""
    if isinstance(value, Tensor):
        out.append(value)
    elif isinstance(value, (tuple, list)) and depth < 2:
        for v in value:
            tensors_in(v, out, depth + 1)
    elif isinstance(value, autodiff.Context) and depth == 0:
        tensors_in(value.saved, out, 1)
        for v in vars(value).values():
            tensors_in(v, out, 1)
    return out


# The ops the tracer knows by their meaning rather than by their backend calls: chapter 12's fused Embedding
# (numpy inside, as the capstone GPT installs it), lowered to index kernels, and the library's CrossEntropy,
# whose one-hot targets it makes from the step's integer input.
LIBRARY = {"Embedding": capstone_functions.Embedding, "CrossEntropy": F.CrossEntropy}


def _is(fn, library_fn):
    """fn is that op, or a subclass that keeps its forward (and so its meaning)."""
    return isinstance(fn, type) and issubclass(fn, library_fn) and fn.forward is library_fn.forward


class Tracer:
    """Records one call of a step. Its recorder is the heart: one node per backend call (Pieces.record,
    chapter 13's first exercise), called as recorder(tracer, kind, op, inputs, out, into, attrs)."""

    def __init__(self, inner, recorder):
        self.inner = inner                  # the backend that computes the values
        self.nodes, self.buffers = [], []
        self.by_storage = {}                # id(storage) -> Buffer
        self.scopes = []                    # the library ops open right now, innermost last
        self.breaks = []                    # (where, what) of values read by Python mid-step
        self.int_inputs = []                # (argument index, Buffer) of the integer arrays passed in
        self.dropped = set()                # buffers made inside an island: only the island knows them
        self.island_of_ctx = {}             # id(ctx) -> the forward island that made it
        self._record = recorder             # the recording function: the course's, or the learner's

    # ---- buffers
    def buffer(self, kind, array, name="", origin=None):
        """A new buffer of the graph over `array` (a constant remembers the line that first used it)."""
        if kind == CONST and origin is None:
            origin = where_from(3)
        buf = Buffer(len(self.buffers), kind, array, name, origin)
        self.buffers.append(buf)
        self.by_storage[id(array)] = buf
        return buf

    def value_of(self, td):
        """The Ref of the TensorData `td` outside a recorded call (an island's operands, the state the step
        leaves, its result): the buffer of its memory, or a constant of the values it holds now."""
        buf = self.by_storage.get(id(td.storage)) or self._constant(td.storage, where_from(3))
        if buf.id in self.dropped:
            raise Unsupported(f"{describe_where(where_from(3))} reads a value made inside an op that runs "
                              "outside the backend; the compiler cannot see how it was made")
        return Ref(buf, View.of(td))

    def _constant(self, storage, origin):
        constant = self.buffer(CONST, storage, origin=origin)
        constant.value = np.array(storage)   # a copy: the library may reuse the memory later
        return constant

    # ---- recording
    def record(self, kind, op, inputs, out, into=False, **attrs):
        """Append the node for one backend call, made by the recorder."""
        scope = self.scopes[0].name if self.scopes else ""   # the op the step called (LayerNorm, not its Sub)
        node = self._record(self, kind, op, inputs, out, into, attrs)
        node.scope, node.where = scope, where_from(3, 1)
        return node

    def fill_scratch(self, storage):
        """A buffer the library made with zeros and now writes into: a scratch buffer and its fill node."""
        if np.any(storage):
            raise Unsupported(f"{describe_where(where_from(3))} writes into memory made outside the step's "
                              "ops that is not all zeros; the compiler can only refill zeros")
        buf = self.buffer(SCRATCH, storage)
        fill = Node(len(self.nodes), "fill", "", [], Ref(buf, View.natural((buf.size,))))
        self.nodes.append(fill)
        buf.producer = fill
        return buf

    # ---- the op mode
    def apply(self, fn, inputs, kwargs, run):
        if _is(fn, LIBRARY["CrossEntropy"]) or fn is OPS.CrossEntropy:   # the library's, or one swapped in
            self.one_hot(inputs[1])
        scope = Scope(fn, "forward", len(self.nodes), [t for t in inputs if isinstance(t, Tensor)], kwargs)
        self.scopes.append(scope)
        try:
            out = run()
        finally:
            self.scopes.pop()
        self.close(scope, [out])
        return out

    def backward(self, fn, ctx, grad, run):
        held = tensors_in(ctx, [])
        if id(ctx) in self.island_of_ctx:   # a forward island's ctx: what that island made (not graph memory),
            held = [t for t in held if id(t.data.storage) in self.by_storage]   # its replay makes again
        scope = Scope(fn, "backward", len(self.nodes), [grad] + held, ctx=ctx)
        self.scopes.append(scope)
        try:
            grads = run()
        finally:
            self.scopes.pop()
        self.close(scope, list(grads) if isinstance(grads, tuple) else [grads])
        return grads

    def read(self, tensor):
        """A value leaves the library: inside an op, the op works outside the backend; outside any op, a
        value computed by the step steers the Python that follows (a graph break)."""
        buf = self.by_storage.get(id(tensor.data.storage))
        if self.scopes:
            self.scopes[-1].reads = True
        elif buf is not None and buf.kind != CONST:
            self.breaks.append((where_from(3), f"reads the value of a tensor the step computed (shape {tensor.shape})"))

    def close(self, scope, outs):
        """An op ended: if it worked outside the backend, replace what it recorded by one island node."""
        given = {id(t.data.storage) for t in scope.tensors}   # a view of an input is not new memory
        fresh = [t for t in outs if isinstance(t, Tensor) and id(t.data.storage) not in self.by_storage
                 and id(t.data.storage) not in given]
        after_island = scope.phase == "backward" and id(scope.ctx) in self.island_of_ctx  # its ctx is Python's
        if not scope.reads and not fresh and not after_island:
            return
        if self.lower_embedding(scope, outs):
            return
        inner = {ref.buffer.id for node in self.nodes[scope.start:]  # what it recorded: the island's business now
                 for ref in [node.out] + node.attrs.get("outs", []) if ref is not None}
        del self.nodes[scope.start:]
        refs = [self.value_of(t.data) for t in scope.tensors]
        outs_refs, made = [], []
        for t in outs:
            if not isinstance(t, Tensor):
                outs_refs.append(None)
                made.append(False)
                continue
            buf = self.by_storage.get(id(t.data.storage))
            if buf is None:
                buf = self.buffer(TEMP, t.data.storage)
            made.append(buf.id in inner or buf.producer is None and buf.kind == TEMP)
            outs_refs.append(Ref(buf, View.of(t.data)))   # not made: a view of memory from before the op
            inner.discard(buf.id)
        self.dropped |= inner
        first = next((r for r in outs_refs if r is not None), None)
        kwargs = {k: self.argument(v) for k, v in scope.kwargs.items()}
        node = Node(len(self.nodes), "island", op_name(scope.fn), refs, first,
                    dict(fn=scope.fn, phase=scope.phase, kwargs=kwargs, outs=outs_refs, made=made, tensors=len(refs)),
                    scope.name, where_from(3, 1))
        for r, m in zip(outs_refs, made):
            if m:
                r.buffer.producer = node
        if scope.phase == "forward" and outs and isinstance(outs[0], Tensor) and outs[0]._ctx is not None:
            self.island_of_ctx[id(outs[0]._ctx)] = node
            node.attrs["ctx"] = outs[0]._ctx
        if scope.phase == "backward":
            node.attrs["forward"] = forward = self.island_of_ctx.get(id(scope.ctx))
            node.attrs["ctx"] = scope.ctx
            if forward is not None:
                node.where = forward.where
            else:  # the capture's own ctx: its integer arrays of the step's inputs are set again at each replay
                node.attrs["ctx_inputs"] = {k: self.argument(v) for k, v in vars(scope.ctx).items()
                                            if isinstance(v, np.ndarray) and v.dtype.kind in "iu"}
        self.nodes.append(node)

    def lower_embedding(self, scope, outs):
        """Chapter 12's Embedding as a gather node (forward) and a scatter-add node (backward, if it is
        chapter 12's too), instead of islands; False where the layouts are not the plain ones."""
        fn = scope.fn
        library = LIBRARY["Embedding"]
        if not _is(fn, library) or (scope.phase == "backward" and fn.backward is not library.backward):
            return False
        if scope.phase == "forward":
            source, idx, kind = scope.tensors[0], scope.kwargs.get("idx"), "gather"
        else:
            source, idx, kind = scope.tensors[0], getattr(scope.ctx, "idx", None), "scatter_add"
        out = outs[0]
        width = out.shape[-1]
        if idx is None or self.nodes[scope.start:] or not isinstance(out, Tensor) or \
                tuple(source.data.strides[-2:]) != (width, 1) or not View.of(out.data).is_natural() or \
                (kind == "scatter_add" and not View.of(source.data).is_natural()):
            return False
        ref, _ = self.int_ref(idx)
        if ref is None:
            buf = self.buffer(CONST, np.array(idx).reshape(-1), origin=where_from(3))
            buf.value = buf.array
            ref = Ref(buf, View.natural(np.shape(idx)))
        elif not ref.view.is_natural() and ref.view.strides != View.natural(ref.view.shape).strides:
            return False
        buf = self.buffer(TEMP, out.data.storage)
        node = Node(len(self.nodes), kind, "", [self.value_of(source.data), ref], Ref(buf, View.of(out.data)),
                    dict(width=width), scope.name, where_from(3, 1))
        self.nodes.append(node)
        buf.producer = node
        return True

    def argument(self, value):
        """An island's keyword argument as the replay will pass it: ("input", Ref, how) for an integer array
        that is an input, ("const", copy) for any other array, ("value", value) for the rest."""
        if isinstance(value, np.ndarray):
            if value.dtype.kind in "iu":
                ref, how = self.int_ref(value)
                if ref is not None:
                    return ("input", ref, how)
            return ("const", np.array(value))
        return ("value", value)

    # ---- integer inputs
    def int_ref(self, array):
        """The Ref of an integer input that `array` is: a view of its memory, or equal to it value by value."""
        array = np.asarray(array)
        item = array.itemsize
        for _, buf in self.int_inputs:
            base = buf.array
            if array.dtype == base.dtype and np.shares_memory(array, base):
                offset = (array.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // item
                return Ref(buf, View(array.shape, tuple(s // item for s in array.strides), offset)), "view"
        for _, buf in self.int_inputs:
            if buf.size == array.size and np.array_equal(buf.array, array.reshape(-1)):
                return Ref(buf, View.natural(array.shape)), "value"
        return None, None

    def one_hot(self, target):
        """cross_entropy's one-hot targets are made by numpy from an integer input: find which, and record
        the node that makes them again at each call."""
        storage = target.data.storage
        if id(storage) in self.by_storage or target.ndim != 2:
            return
        values = target.data.to_numpy()
        if not (((values == 0) | (values == 1)).all() and (values.sum(-1) == 1).all()):
            return
        ref, how = self.int_ref(values.argmax(-1))
        if ref is None:
            return
        ref = Ref(ref.buffer, View(ref.view.shape + (1,), ref.view.strides + (0,), ref.view.offset))  # one per row
        buf = self.buffer(TEMP, storage)
        node = Node(len(self.nodes), "one_hot", "", [ref], Ref(buf, View.of(target.data)),
                    dict(classes=target.shape[1], matched=how), "cross_entropy", where_from(3, 1))
        self.nodes.append(node)
        buf.producer = node


# ---- one capture ----------------------------------------------------------------------------------------

def _static(arg, k, tracer):
    """The argument as the traced call sees it: tensors and arrays copied into memory of the compiled step."""
    if isinstance(arg, Tensor):
        array = np.array(arg.data.to_numpy()).reshape(-1)
        buf = tracer.buffer(INPUT, array, f"arg{k}", k)
        return buf, Tensor._wrap(TensorData.contiguous(array, tuple(arg.shape)), arg.requires_grad)
    if hasattr(arg, "__array__") and not isinstance(arg, (nn.Module, optim.Optimizer)) and \
            np.asarray(arg).dtype.kind in "iuf" and np.ndim(arg) > 0:
        value = np.array(np.asarray(arg))
        buf = tracer.buffer(INPUT, value.reshape(-1), f"arg{k}", k)
        if value.dtype.kind in "iu":
            tracer.int_inputs.append((k, buf))
        return buf, buf.array.reshape(value.shape)
    return None, arg


def _refs(value, tracer):
    """The step's return value with each tensor replaced by its Ref."""
    if isinstance(value, Tensor):
        return tracer.value_of(value.data)
    if isinstance(value, (tuple, list)):
        return type(value)(_refs(v, tracer) for v in value)
    if isinstance(value, dict):
        return {k: _refs(v, tracer) for k, v in value.items()}
    return value


def capture(fn, args, recorder):
    """Run fn(*args) once with every op recorded by `recorder` (Pieces.record); return (Graph, the call's
    result).

    The call really happens, on the backend that is current: its result and its effects on the
    arguments' objects (an optimizer step) are those of an eager call."""
    inner = current_backend()
    if isinstance(inner, TracingBackend):
        raise Unsupported("a compiled step cannot be captured inside another capture")
    tracer = Tracer(inner, recorder)
    statics = [_static(a, k, tracer) for k, a in enumerate(args)]
    slots = find_slots(args)
    for slot in slots:
        td = slot.get()
        if td is not None:
            buf = tracer.by_storage.get(id(td.storage)) or tracer.buffer(STATE, td.storage, slot.name, [])
            buf.origin.append(slot.name)
            slot.before = Ref(buf, View.of(td))
    with tracing(tracer):
        result = fn(*[s[1] for s in statics])
    for slot in find_slots(args):  # the places the step added (an optimizer's state, at its first step)
        if all(slot.owner is not s.owner or slot.key != s.key or slot.how != s.how for s in slots):
            slots.append(slot)
    for slot in slots:
        td = slot.get()
        slot.after = None if td is None else tracer.value_of(td)
    graph = Graph(tracer.nodes, tracer.buffers, [s[0] for s in statics], slots, _refs(result, tracer), tracer.breaks)
    return graph, result
