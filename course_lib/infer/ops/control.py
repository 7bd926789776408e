"""Control flow: If, Loop and Scan, whose attributes are whole graphs that the engine runs.

`load` turns each subgraph into a Graph and appends the values it reads from the graph around it
to the node's inputs (their names are the attribute `_outer`), so these kernels receive them as
their last positional arguments.
"""

import numpy as np

from ..ir import Graph, Value
from ..registry import Unsupported, bind, register
from ..schedule import topological_order


def _program(body, outer):
    """The body's nodes in schedule order with their kernels, worked out once per body (kept on it)."""
    cache = body.__dict__.setdefault("_programs", {})
    if outer not in cache:
        known = Graph(body.nodes, body.inputs + [Value(n) for n in outer], body.outputs, body.initializers,
                      body.opsets)
        cache[outer] = [(node, *bind(body, node)) for node in topological_order(known)]
    return cache[outer]


def run_body(body, values, outer):
    """The outputs of subgraph `body` for its inputs `values` (a list), reading `outer` (a dict) as well."""
    env = {**outer, **body.initializers}
    env.update(zip([v.name for v in body.inputs], values))
    for node, fn, attrs in _program(body, tuple(outer)):
        out = fn(*[env[i] if i else None for i in node.inputs], **attrs)
        for name, value in zip(node.outputs, out if isinstance(out, tuple) else (out,)):
            if name:
                env[name] = np.asarray(value)
    return [env[v.name] for v in body.outputs]


def _split(args, outer_names):
    """(the node's own inputs, {outer name: value})."""
    k = len(outer_names)
    own = args[:len(args) - k]
    return list(own), dict(zip(outer_names, args[len(args) - k:]))


@register("If", since=1)
def if_(cond, *args, then_branch, else_branch, _outer=(), _n_outputs=1):
    """Run one branch, chosen by the boolean scalar cond; its outputs are the node's."""
    _, outer = _split(args, _outer)
    outs = run_body(then_branch if bool(np.asarray(cond).reshape(-1)[0]) else else_branch, [], outer)
    return tuple(outs) if _n_outputs > 1 else outs[0]


@register("Loop", since=1)
def loop(*args, body, _outer=(), _n_outputs=1):
    """for i in range(M) while cond: (cond, carried..., scan outputs...) = body(i, cond, carried...).

    M and cond are optional (left-out inputs are None). The scan outputs of every iteration are
    stacked along a new first axis."""
    own, outer = _split(args, _outer)
    trips, cond, carried = own[0], own[1], own[2:]
    limit = None if trips is None else int(np.asarray(trips).reshape(-1)[0])
    go = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
    scans = [[] for _ in range(len(body.outputs) - 1 - len(carried))]
    i = 0
    while go and (limit is None or i < limit):
        outs = run_body(body, [np.array(i, np.int64), np.array(go)] + carried, outer)
        go, carried = bool(np.asarray(outs[0]).reshape(-1)[0]), outs[1:1 + len(carried)]
        for acc, value in zip(scans, outs[1 + len(carried):]):
            acc.append(value)
        i += 1
    if any(not acc for acc in scans):
        raise Unsupported("Loop with no iteration and scan outputs (their shape is unknown)")
    results = list(carried) + [np.stack(acc) for acc in scans]
    return tuple(results) if _n_outputs > 1 else results[0]


@register("Scan", since=9)
def scan(*args, body, num_scan_inputs, scan_input_axes=None, scan_input_directions=None, scan_output_axes=None,
         scan_output_directions=None, _outer=(), _n_outputs=1):
    """states..., scan outputs... = fold of body over slices of the scan inputs along their axes.

    The body takes (states..., one slice of each scan input) and returns (new states..., one slice
    of each scan output); the slices of each scan output are stacked along its axis, in reverse
    order when its direction is 1 (as the scan inputs are read backwards when theirs is)."""
    own, outer = _split(args, _outer)
    n_state = len(own) - num_scan_inputs
    states, xs = own[:n_state], own[n_state:]
    in_axes = [a % x.ndim for a, x in zip(scan_input_axes or [0] * len(xs), xs)]
    in_dirs = scan_input_directions or [0] * len(xs)
    steps = xs[0].shape[in_axes[0]] if xs else 0
    n_scan_out = len(body.outputs) - n_state
    outs = [[] for _ in range(n_scan_out)]
    for t in range(steps):
        slices = [np.take(x, steps - 1 - t if d else t, axis=a) for x, a, d in zip(xs, in_axes, in_dirs)]
        result = run_body(body, list(states) + slices, outer)
        states = result[:n_state]
        for acc, value in zip(outs, result[n_state:]):
            acc.append(value)
    out_dirs = scan_output_directions or [0] * n_scan_out
    results = list(states)
    for k, (acc, d) in enumerate(zip(outs, out_dirs)):
        if not acc:
            raise Unsupported("Scan with no iteration and scan outputs (their shape is unknown)")
        axis = (scan_output_axes or [0] * n_scan_out)[k] % (acc[0].ndim + 1)
        results.append(np.stack(acc[::-1] if d else acc, axis=axis))
    return tuple(results) if _n_outputs > 1 else results[0]
