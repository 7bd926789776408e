"""Nodes and graphs: define first, run later.

A Node records an operation and its inputs; nothing is computed when it is built. Only
its static shape is worked out at once (see ops.py, which also gives Node its operators),
so a mismatch is reported where the graph is defined, not deep inside a later run. A
dimension may be None (unknown until run time, such as the batch size).
"""

import itertools

import numpy as np


class Graph:
    """The nodes defined while this graph was the default (TF1's `tf.Graph`)."""

    _stack = []

    def __init__(self):
        self.nodes = []

    def __enter__(self):
        Graph._stack.append(self)
        return self

    def __exit__(self, *exc):
        Graph._stack.pop()

    def variables(self):
        return [n for n in self.nodes if n.op.name == "variable"]


_default = Graph()


def default_graph():
    return Graph._stack[-1] if Graph._stack else _default


class TraceError(RuntimeError):
    """A graph node was used as a concrete value: data-dependent Python control flow."""


class Node:
    _ids = itertools.count()

    def __init__(self, op, inputs=(), **attrs):
        self.op = op
        self.inputs = list(inputs)
        self.attrs = attrs
        self.id = next(Node._ids)
        self.name = attrs.pop("name", None) or f"{op.name}_{self.id}"
        self.shape = op.infer_shape(self)
        default_graph().nodes.append(self)

    def __repr__(self):
        return f"<{self.name}: {self.op.name}{list(self.shape)}>"

    def with_inputs(self, inputs):
        """A copy of this node (same op and attributes) reading other inputs."""
        return Node(self.op, inputs, **self.attrs)

    # The build-time sugar (x + y, x @ w, x.sum(), x.T, ...) and `Node.constant`, the op that
    # wraps a plain value, are attached by ops.py, where the ops are defined (as TF1's math_ops does).
    constant = None

    # A node has no value while the graph is being built: refuse to pretend it does.
    def _no_value(self, *args):
        raise TraceError(f"{self.name} is a graph node, not a value: Python control flow that depends on data "
                         "(if/while on a tensor, float(), len(), iteration) cannot be captured in a graph. "
                         "Compute both branches and select with a graph op, or run it eagerly.")

    __bool__ = __float__ = __int__ = __index__ = __len__ = __iter__ = item = _no_value
    __hash__ = object.__hash__
    __array_ufunc__ = None  # so numpy hands `array @ node` back to the node


def as_node(x):
    """Nodes pass through; numbers, arrays and eager tensors become constants."""
    if isinstance(x, Node):
        return x
    if hasattr(x, "numpy") and callable(x.numpy):
        x = x.detach().numpy() if hasattr(x, "detach") else x.numpy()
    return Node.constant(np.asarray(x, dtype=np.float64))
