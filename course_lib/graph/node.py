"""Nodes and graphs: define first, run later.

A Node records an operation and its inputs; nothing is computed when it is built. Only
its static shape is worked out at once (see ops.py), so a mismatch is reported where the
graph is defined, not deep inside a later run. A dimension may be None (unknown until
run time, such as the batch size).
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

    # Build-time sugar: each operator makes a node (see ops.py for the ops themselves).
    def __add__(self, other): return ops.add(self, other)
    def __radd__(self, other): return ops.add(other, self)
    def __sub__(self, other): return ops.sub(self, other)
    def __rsub__(self, other): return ops.sub(other, self)
    def __mul__(self, other): return ops.mul(self, other)
    def __rmul__(self, other): return ops.mul(other, self)
    def __truediv__(self, other): return ops.div(self, other)
    def __rtruediv__(self, other): return ops.div(other, self)
    def __matmul__(self, other): return ops.matmul(self, other)
    def __rmatmul__(self, other): return ops.matmul(other, self)
    def __neg__(self): return ops.neg(self)
    def __gt__(self, other): return ops.greater(self, other)
    def __lt__(self, other): return ops.greater(other, self)
    def __pow__(self, p): return ops.power(self, p)

    def sum(self, dim=None, keepdim=False): return ops.reduce_sum(self, dim, keepdim)
    def mean(self, dim=None, keepdim=False): return ops.reduce_mean(self, dim, keepdim)
    def reshape(self, *shape): return ops.reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)
    def relu(self): return ops.relu(self)
    def exp(self): return ops.exp(self)
    def log(self): return ops.log(self)
    def sigmoid(self): return ops.sigmoid(self)

    @property
    def T(self): return ops.transpose(self)

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
    return ops.constant(np.asarray(x, dtype=np.float64))


def topo_order(outputs):
    """Every node the outputs depend on, each after its inputs. An explicit stack, no recursion."""
    order, seen = [], set()
    for out in outputs:
        stack = [(out, False)]
        while stack:
            node, inputs_done = stack.pop()
            if inputs_done:
                order.append(node)
            elif node not in seen:
                seen.add(node)
                stack.append((node, True))
                stack.extend((i, False) for i in reversed(node.inputs) if i not in seen)
    return order


from course_lib.graph import ops  # noqa: E402  (ops needs Node; Node's operators need ops)
