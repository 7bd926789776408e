"""A scalar autograd engine with micrograd's API.

Each operation makes a new `Value` that remembers its children and the name of its op.
Right below each forward op sits its backward rule, a method of the *output* node `out`: it
adds `out.grad * d(out)/d(child)` into each child's grad. `backward()` looks the rule up by
op name in `RULES`. micrograd stores each rule as a closure on the node instead; a closure that
mentions `out` makes every node a reference cycle, and then only Python's slow cycle
collector can free a graph. Here a graph holds no cycles and is freed as soon as it is dropped.
"""

import math


class Value:
    """One number in a computation graph, with the gradient of the graph's output with respect to it."""

    __slots__ = ("data", "grad", "_prev", "_op", "_arg", "label")

    def __init__(self, data, _children=(), _op="", _arg=None, label=""):
        self.data = data
        self.grad = 0
        self._prev = _children         # the inputs of the op that made this node
        self._op = _op                 # "" for a leaf, else a key of RULES
        self._arg = _arg               # a constant the rule needs: the exponent of **
        self.label = label             # a name for pictures

    def __add__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        return Value(self.data + other.data, (self, other), "+")

    def _add_backward(out):
        a, b = out._prev
        a.grad += out.grad
        b.grad += out.grad

    def __mul__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        return Value(self.data * other.data, (self, other), "*")

    def _mul_backward(out):
        a, b = out._prev
        a.grad += b.data * out.grad
        b.grad += a.data * out.grad

    def __pow__(self, k):
        assert isinstance(k, (int, float)), "only int or float exponents are supported"
        return Value(self.data**k, (self,), "**", k)

    def _pow_backward(out):
        (a,), k = out._prev, out._arg
        a.grad += k * a.data ** (k - 1) * out.grad

    def relu(self):
        return Value(self.data if self.data > 0 else 0, (self,), "relu")

    def _relu_backward(out):
        (a,) = out._prev
        a.grad += (out.data > 0) * out.grad

    def tanh(self):
        return Value(math.tanh(self.data), (self,), "tanh")

    def _tanh_backward(out):
        (a,) = out._prev
        a.grad += (1 - out.data**2) * out.grad

    def exp(self):
        return Value(math.exp(self.data), (self,), "exp")

    def _exp_backward(out):
        (a,) = out._prev
        a.grad += out.data * out.grad

    def log(self):
        return Value(math.log(self.data), (self,), "log")

    def _log_backward(out):
        (a,) = out._prev
        a.grad += out.grad / a.data

    def _backward(self):
        """Add this node's share to its children's grads (a leaf has nothing to do)."""
        if self._op:
            RULES[self._op](self)

    def backward(self):
        """Set v.grad = d(self)/d(v) for every node v of the graph under self.

        All grads of the graph are reset to 0 first, so a second call gives the same grads
        as the first: re-running a notebook cell is safe. To add up the gradients of two
        losses, call backward() on their sum.
        """
        topo = topological_order(self)
        for v in topo:
            v.grad = 0
        self.grad = 1
        for v in reversed(topo):
            if v._op:
                RULES[v._op](v)

    # The rest is built from the ops above, as in micrograd.
    def __neg__(self):  # -self
        return self * -1

    def __radd__(self, other):  # other + self
        return self + other

    def __sub__(self, other):  # self - other
        return self + (-other)

    def __rsub__(self, other):  # other - self
        return other + (-self)

    def __rmul__(self, other):  # other * self
        return self * other

    def __truediv__(self, other):  # self / other
        return self * other**-1

    def __rtruediv__(self, other):  # other / self
        return other * self**-1

    def __repr__(self):
        return f"Value(data={self.data}, grad={self.grad})"


RULES = {"+": Value._add_backward, "*": Value._mul_backward, "**": Value._pow_backward,
         "relu": Value._relu_backward, "tanh": Value._tanh_backward, "exp": Value._exp_backward,
         "log": Value._log_backward}


def topological_order(root):
    """Every node under `root`, each after all of its children, without recursion.

    A depth-first search with an explicit stack. A node stays on the stack while its
    children are explored above it; when it is on top again, they are all done, so it
    is emitted. Works at any depth, where a recursive version stops near 1,000.
    """
    order, seen, done = [], set(), set()
    stack = [root]
    while stack:
        v = stack[-1]
        if v not in seen:  # first time on top: explore its children
            seen.add(v)
            for child in v._prev:
                if child not in seen:
                    stack.append(child)
        else:  # on top again: its children are done
            stack.pop()
            if v not in done:
                done.add(v)
                order.append(v)
    return order
