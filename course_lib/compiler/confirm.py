"""Trusting a capture: a second capture must agree with the first.

A capture records what one call did. A replay repeats it, so the compiler must know that the next call
would do the same. Two captures of two calls are compared:

- their structure (`signature`): the same nodes, reading the same views of the same kinds of buffers,
  and the same places of state. A first call often differs from the second (an optimizer makes its
  moments at its first step), so the compiler captures until two calls in a row agree;
- their constants (`changed_constants`): values made outside the step's ops and baked into it. If one
  changed between the calls (a Python number such as Adam's bias correction 1 - b1**t, or a dropout
  mask drawn with numpy), a replay would repeat a stale value: the compiler refuses, and names the line
  that used it.
"""

import numpy as np

from course_lib.compiler.ir import CONST, INPUT, STATE, Ref


def signature(graph):
    """A hashable description of everything a replay repeats, except the constants' values."""
    tokens, buffers = {}, []

    def tok(buf):
        if buf.id not in tokens:
            tokens[buf.id] = len(tokens)
            origin = buf.origin if buf.kind == INPUT else tuple(buf.origin) if buf.kind == STATE else None
            buffers.append((buf.kind, buf.dtype.str, buf.size, origin))
        return tokens[buf.id]

    def ref(r):
        return None if r is None else (tok(r.buffer), r.view)

    def argument(value):
        what, item = value[0], value[1]
        if what == "input":
            return (what, ref(item), value[2])
        if what == "const":
            return (what, item.shape, item.dtype.str)
        try:
            hash(item)
            return (what, type(item).__name__, item)
        except TypeError:
            return (what, type(item).__name__, repr(item))

    position = {n.id: k for k, n in enumerate(graph.nodes)}
    nodes = []
    for n in graph.nodes:
        attrs = []
        for key, value in sorted(n.attrs.items()):
            if key in ("ctx", "replay_ctx"):
                continue
            if key == "fn":
                value = f"{value.__module__}.{value.__qualname__}"
            elif key in ("after", "forward"):
                value = None if value is None else position.get(value.id)
            elif key == "outs":
                value = tuple(ref(r) for r in value)
            elif key in ("kwargs", "ctx_inputs"):
                value = tuple((k, argument(v)) for k, v in sorted(value.items()))
            attrs.append((key, value))
        nodes.append((n.kind, n.op, tuple(attrs), tuple(ref(r) for r in n.inputs), ref(n.out), n.scope))
    slots = tuple((s.name, s.how, ref(s.before), ref(s.after)) for s in graph.slots)
    result = _result_key(graph.result, ref)
    return tuple(nodes), slots, result, tuple(buffers)


def _result_key(value, ref):
    if isinstance(value, Ref):
        return ("ref", ref(value))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_result_key(v, ref) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _result_key(v, ref)) for k, v in value.items()))
    return ("value", repr(value))


def _constants(graph):
    """The constants in the order a signature meets them: buffers first, then islands' array arguments."""
    seen, out = set(), []

    def visit(buf):
        if buf.kind == CONST and buf.id not in seen:
            seen.add(buf.id)
            out.append((buf.value, buf.origin))

    for n in graph.nodes:
        for r in n.inputs:
            visit(r.buffer)
        for value in list(n.attrs.get("kwargs", {}).values()) + list(n.attrs.get("ctx_inputs", {}).values()):
            if value[0] == "const":
                out.append((value[1], n.where))
    for s in graph.slots:
        for r in (s.before, s.after):
            if r is not None:
                visit(r.buffer)
    return out


def changed_constants(first, second):
    """[(where, old values, new values)] for the constants of two captures (of the same signature) that differ."""
    changed = []
    for (a, _), (b, where) in zip(_constants(first), _constants(second)):
        if a.shape != b.shape or not np.array_equal(a, b, equal_nan=True):
            changed.append((where, a, b))
    return changed


def describe_change(old, new):
    if old.size == 1 and new.size == 1:
        return f"a number that was {old.reshape(-1)[0]:.6g} at one call and {new.reshape(-1)[0]:.6g} at the next"
    return f"an array of shape {new.shape} made outside the step's ops, with other values at each call"
