"""The course's scalar engine: chapter 01's answers, assembled into micrograd's `Value`.

`Value` is the node of value.py with the ops the exercises write, `*`, `**`, `exp`, `tanh` and `relu`
(each forward right above its backward rule, which backward() finds by op name in RULES), and a
`backward()` that walks a topological order found without recursion and starts from zero on every call.
Each piece is marked with the exercise it answers: read it once your check passes.
"""

import math

from course_lib.autograd import value
from course_lib.autograd.value import RULES


class Value(value.Value):
    """One number in a computation graph, with micrograd's operators and backward()."""

    __slots__ = ()

    def __mul__(self, other):
        """The course's answer to exercise 01.1 (`mul`): read it once your check passes."""
        other = self._node(other)
        return Value(self.data * other.data, (self, other), "*")

    def _mul_backward(out):
        """The course's answer to exercise 01.1 (`mul`): read it once your check passes."""
        a, b = out._prev
        a.grad += b.data * out.grad
        b.grad += a.data * out.grad

    def exp(self):
        """The course's answer to exercise 01.2 (`exp`): read it once your check passes."""
        return Value(math.exp(self.data), (self,), "exp")

    def _exp_backward(out):
        """The course's answer to exercise 01.2 (`exp`): read it once your check passes."""
        (a,) = out._prev
        a.grad += out.data * out.grad

    def __pow__(self, k):
        """The course's answer to exercise 01.3 (`power`): read it once your check passes."""
        assert isinstance(k, (int, float)), "only int or float exponents are supported"
        return Value(self.data**k, (self,), "**", k)

    def _pow_backward(out):
        """The course's answer to exercise 01.3 (`power`): read it once your check passes."""
        (a,), k = out._prev, out._arg
        a.grad += k * a.data ** (k - 1) * out.grad

    def tanh(self):
        """The course's answer to exercise 01.4 (`tanh`): read it once your check passes."""
        return Value(math.tanh(self.data), (self,), "tanh")

    def _tanh_backward(out):
        """The course's answer to exercise 01.4 (`tanh`): read it once your check passes."""
        (a,) = out._prev
        a.grad += (1 - out.data**2) * out.grad

    def relu(self):
        """The course's answer to exercise 01.5 (`relu`): read it once your check passes."""
        return Value(self.data if self.data > 0 else 0, (self,), "relu")

    def _relu_backward(out):
        """The course's answer to exercise 01.5 (`relu`): read it once your check passes."""
        (a,) = out._prev
        a.grad += (out.data > 0) * out.grad

    def backward(self):
        """The course's answer to exercise 01.7 (`backward`): read it once your check passes.

        Set v.grad = d(self)/d(v) for every node v of the graph under self. All grads of the graph
        are reset to 0 first, so a second call gives the same grads as the first: re-running a
        notebook cell is safe. To add up the gradients of two losses, call backward() on their sum."""
        order = topological_order(self)
        for v in order:
            v.grad = 0
        self.grad = 1
        for v in reversed(order):
            v._backward()

    # The rest is built from the ops above, as in micrograd.
    def __neg__(self):  # -self
        return self * -1

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


RULES.update({"*": Value._mul_backward, "**": Value._pow_backward, "relu": Value._relu_backward,
              "tanh": Value._tanh_backward, "exp": Value._exp_backward})


def topological_order(root):
    """The course's answer to exercise 01.6 (`topological_order`): read it once your check passes.

    Every node under `root`, each after all of its children, without recursion: a depth-first
    search with an explicit stack. A node stays on the stack while its children are explored above
    it; when it is on top again, they are all done, so it is emitted. Works at any depth, where a
    recursive version stops near 1,000."""
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
