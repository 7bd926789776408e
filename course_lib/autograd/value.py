"""The node of chapter 01's scalar engine: what every op of the engine makes.

A `Value` holds one number (`data`), the gradient of the graph's output with respect to it (`grad`),
and the record of the op that made it: its inputs in order (`_prev`, the same node twice for x + x),
the op's name (`_op`, "" for an input) and a constant the op needs (`_arg`). An op is two functions
side by side: a forward that makes the output node, and a backward rule, a function of the output node
`out` that adds out.grad * d(out)/d(input) into each input's grad. A backward pass finds each node's
rule by op name in `RULES`, so a node refers only to its inputs, never to itself: a graph holds no
reference cycle and is freed as soon as it is dropped (micrograd keeps each rule as a closure on its
node, which makes every node a cycle that only Python's slow cycle collector can free).

This file has the lesson's two ops, `+` and `log`; the engine (engine.py) builds on this node.
"""

import math

RULES = {}
"""op name -> its backward rule, a function of the output node: the one place a backward pass looks."""


class Value:
    """One number in a computation graph, with the gradient of the graph's output with respect to it."""

    __slots__ = ("data", "grad", "_prev", "_op", "_arg", "label")

    def __init__(self, data, _children=(), _op="", _arg=None, label=""):
        self.data = data
        self.grad = 0
        self._prev = _children         # the inputs of the op that made this node
        self._op = _op                 # "" for an input, else a key of RULES
        self._arg = _arg               # a constant the op's rule needs
        self.label = label             # a name for pictures

    def _node(self, other):
        """`other` as a node (a Python number becomes an input node of this node's class)."""
        return other if isinstance(other, Value) else type(self)(other)

    def _made_with(self, other):
        """The class of an op's output: the more derived of its inputs' (a plain node plus an engine's
        node gives an engine's node, with all of its ops)."""
        return type(other) if issubclass(type(other), type(self)) else type(self)

    def __add__(self, other):
        other = self._node(other)
        return self._made_with(other)(self.data + other.data, (self, other), "+")

    def __radd__(self, other):  # other + self
        return self + other

    def log(self):
        return type(self)(math.log(self.data), (self,), "log")

    def _backward(self):
        """Add this node's share into its inputs' grads (an input node has nothing to do)."""
        if self._op:
            RULES[self._op](self)

    def __repr__(self):
        return f"Value(data={self.data}, grad={self.grad})"


def _add_backward(out):
    a, b = out._prev
    a.grad += out.grad
    b.grad += out.grad


def _log_backward(out):
    (a,) = out._prev
    a.grad += out.grad / a.data


RULES.update({"+": _add_backward, "log": _log_backward})
