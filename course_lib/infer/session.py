"""InferenceSession: load, validate, (optionally) optimize, schedule, then run. onnxruntime's API."""

import inspect
import time
from dataclasses import dataclass

import numpy as np

from . import ops  # noqa: F401  (fills the registry)
from .arena import keep_freed_memory
from .ir import Graph
from .load import load
from .memory import assign_buffers
from .passes import optimize as run_passes
from .registry import bind
from .schedule import last_uses, topological_order
from .validate import check_feeds, check_graph

_ONNX_TYPE = {"float32": "float", "float64": "double", "float16": "float16", "int64": "int64", "int32": "int32",
              "int8": "int8", "uint8": "uint8", "bool": "bool", "int16": "int16", "uint16": "uint16",
              "uint32": "uint32", "uint64": "uint64"}


@dataclass
class NodeArg:
    """Like onnxruntime's NodeArg: name, shape (ints, or names for dynamic axes) and type 'tensor(float)'."""
    name: str
    shape: list
    type: str


def _node_arg(v):
    t = f"tensor({_ONNX_TYPE.get(str(v.dtype), str(v.dtype))})" if v.dtype is not None else "unknown"
    return NodeArg(v.name, None if v.shape is None else list(v.shape), t)


def _takes_out_buffer(fn):
    """Whether a kernel declares a keyword-only `out`: a flat buffer from the memory plan, which the
    kernel reshapes itself. numpy's ufuncs also take `out`, but it must have the result's shape, so
    they are registered as they are and never get a planned buffer."""
    try:
        param = inspect.signature(fn).parameters.get("out")
    except (TypeError, ValueError):   # a builtin without a signature
        return False
    return param is not None and param.kind is inspect.Parameter.KEYWORD_ONLY


class InferenceSession:
    """Run an ONNX model with numpy kernels.

        sess = InferenceSession("model.onnx")            # or bytes, a ModelProto, or our Graph
        y, = sess.run(None, {"x": x})

    optimize=True applies the passes of `course_lib.infer.passes` (input_shapes: static shapes
    for shape folding). free_memory=False keeps every intermediate (the naive memory plan).
    plan_buffers=True: from the second run with the same input shapes on, the kernels that can write
    into a buffer they are given get one from `memory.assign_buffers`, allocated once.
    arena=True lets malloc keep freed buffers for the next run (see `arena`; process-wide, as
    onnxruntime's arena is on by default).
    """

    def __init__(self, model, optimize=False, input_shapes=None, free_memory=True, arena=True, plan_buffers=True):
        if arena:
            keep_freed_memory()
        graph = model.copy() if isinstance(model, Graph) else load(model)
        check_graph(graph)
        if optimize:
            graph = run_passes(graph, input_shapes)
            check_graph(graph)
        self.graph = graph
        self.order = topological_order(graph)
        keep = {v.name for v in graph.outputs}
        last = last_uses(self.order, keep) if free_memory else {}
        self.frees = [[] for _ in self.order]
        for name, k in last.items():
            if name not in graph.initializers:
                self.frees[k].append(name)
        self.steps = [bind(graph, node) for node in self.order]
        self.output_names = [v.name for v in graph.outputs]
        self.plan_buffers = plan_buffers and free_memory
        self.writes_into_out = [len(node.outputs) == 1 and _takes_out_buffer(fn)
                                for node, (fn, _) in zip(self.order, self.steps)]
        self.plans = self.plan_buffers and any(self.writes_into_out)
        self.planned = None   # (input signature, steps with their `out` buffers, the buffers)
        self.input_names = [v.name for v in graph.inputs]
        self.checked = None   # the signature of the last feeds that check_feeds accepted
        self.wiring = [(tuple(node.inputs), tuple(node.outputs), len(node.outputs) == 1) for node in self.order]

    def get_inputs(self):
        return [_node_arg(v) for v in self.graph.inputs]

    def get_outputs(self):
        return [_node_arg(v) for v in self.graph.outputs]

    def run(self, output_names, feeds, on_node=None):
        """Compute the named outputs (None: all) from {input name: array}; returns a list of arrays.

        on_node(node, seconds, outputs) is called after each node (the profiler and memory plan use it).
        """
        signature = self._signature(feeds)
        if signature is None or signature != self.checked:   # feeds like the last good ones need no new check
            check_feeds(self.graph, feeds)
            self.checked = signature
        steps = self.steps
        if self.plans and on_node is None and signature is not None:   # None: an ndarray subclass, no plan
            if self.planned is not None and self.planned[0] == signature:
                steps = self.planned[1]
            else:   # this run measures every intermediate, and the next ones use the plan made from it
                record = {"sizes": {}, "views": []}
                outputs = self._execute(output_names, feeds, steps, None, record)
                self.planned = (signature, *self._planned_steps(record["sizes"], record["views"]))
                return outputs
        if on_node is None:
            return self._execute_fast(output_names, feeds, steps)
        return self._execute(output_names, feeds, steps, on_node)

    def _signature(self, feeds):
        """The (shape, dtype) of each input, in order; None unless `feeds` holds exactly the inputs, as
        numpy arrays. check_feeds passed once on a signature passes on every feed with the same one."""
        if len(feeds) != len(self.input_names):
            return None
        signature = []
        for name in self.input_names:
            x = feeds.get(name)
            if type(x) is not np.ndarray:
                return None
            signature.append((x.shape, x.dtype))
        return tuple(signature)

    def _planned_steps(self, sizes, views):
        """The steps, with an `out` buffer for each node that can take one (see memory.assign_buffers)."""
        keep = set(self.output_names)
        assigned, specs = assign_buffers(self.order, self.writes_into_out, sizes, views, keep)
        buffers = [np.empty(nbytes // np.dtype(dtype).itemsize, dtype) for nbytes, dtype in specs]
        steps = [(fn, {**attrs, "out": buffers[assigned[k]]}) if k in assigned else (fn, attrs)
                 for k, (fn, attrs) in enumerate(self.steps)]
        return steps, buffers

    def _execute(self, output_names, feeds, steps, on_node, record=None):
        """The executor: run the nodes in schedule order, each on its inputs from `env`; free each
        value after its last reader. on_node, when given, sees every node's time and outputs; record,
        when given, receives each output's (nbytes, dtype) and whether each node returned a view of
        an input (the memory plan needs both)."""
        env = {**self.graph.initializers, **feeds}
        for node, (fn, attrs), frees in zip(self.order, steps, self.frees):
            t0 = time.perf_counter()
            args = [env[i] if i else None for i in node.inputs]
            out = fn(*args, **attrs)
            if type(out) is not tuple:
                out = (out,)
            for name, value in zip(node.outputs, out):
                if name:
                    env[name] = value if type(value) is np.ndarray else np.asarray(value)
            made = [env[n] for n in node.outputs if n]
            if on_node:
                on_node(node, time.perf_counter() - t0, made)
            if record is not None:
                record["sizes"].update({n: (v.nbytes, v.dtype.str) for n, v in zip([o for o in node.outputs if o], made)})
                record["views"].append(any(np.may_share_memory(o, a) for o in made for a in args
                                           if isinstance(a, np.ndarray)))
            for name in frees:
                env.pop(name, None)
        return [env[n] for n in output_names or self.output_names]

    def _execute_fast(self, output_names, feeds, steps):
        """`_execute` without the observer, its loop trimmed: a small model's run is mostly this loop."""
        env = {**self.graph.initializers, **feeds}
        for (fn, attrs), (inputs, outputs, single), frees in zip(steps, self.wiring, self.frees):
            out = fn(*[env[i] if i else None for i in inputs], **attrs)
            if single and type(out) is np.ndarray:
                env[outputs[0]] = out
            else:
                for name, value in zip(outputs, out if type(out) is tuple else (out,)):
                    if name:
                        env[name] = value if type(value) is np.ndarray else np.asarray(value)
            for name in frees:
                env.pop(name, None)
        return [env[n] for n in output_names or self.output_names]
