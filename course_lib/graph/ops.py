"""The graph's operations. Each op is a pair: `compute` (numpy values in, value out) and
`gradient` (graph nodes in, graph nodes out: the adjoint of every input, built as new nodes
so the gradient graph can itself be differentiated). `infer_shape` runs when a node is built.

The gradients of `*`, `@` and `sum` are chapter 03's exercises: those ops look their rule up in
GRADIENT_RULES, where the package puts the course's answers (answers.py; read them once your checks pass).
"""

import numpy as np

from course_lib.graph.node import Node, as_node
from course_lib.tensor.tensor_data import ShapeError  # chapter 02's; here it is raised while the graph is defined


def broadcast_shape(a, b, op):
    """numpy's broadcasting rule on static shapes; None (unknown) matches anything."""
    out = []
    for x, y in zip(((1,) * len(b) + a)[-max(len(a), len(b)):], ((1,) * len(a) + b)[-max(len(a), len(b)):]):
        if x == 1 or x == y:
            out.append(y)
        elif y == 1:
            out.append(x)
        elif x is None or y is None:
            out.append(x if y is None else y)
        else:
            raise ShapeError(f"{op}: shapes {a} and {b} do not broadcast (dimension {x} vs {y})")
    return tuple(out)


def axes_of(dim, ndim, op="sum", shape=None):
    """The dimensions `dim` names, as sorted non-negative ints; each must lie in -ndim..ndim-1."""
    if dim is None:
        return tuple(range(ndim))
    dims = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
    bad = [d for d in dims if not isinstance(d, (int, np.integer)) or not -ndim <= d < ndim]
    if bad or len(set(d % ndim for d in dims)) < len(dims):
        what = f"dimension {bad[0]} is out of range" if bad else f"dimensions {dims} repeat"
        allowed = f"dims from {-ndim} to {ndim - 1}" if ndim else "no dims (it is a scalar)"
        raise ShapeError(f"{op}: {what} for shape {shape if shape is not None else ndim}, which has {allowed}")
    return tuple(sorted(d % ndim for d in dims))


GRADIENT_RULES = {}
"""op name -> gradient rule (node, g) -> [one part per input], for mul, matmul and sum."""


class Op:
    name = "op"

    def __call__(self, *inputs, **attrs):
        return Node(self, [as_node(i) for i in inputs], **attrs)

    def infer_shape(self, node):
        return node.inputs[0].shape  # elementwise unary ops keep the shape

    def compute(self, node, *values):
        raise NotImplementedError

    def gradient(self, node, g):
        raise NotImplementedError(f"{self.name} has no gradient")


# ---- leaves ----------------------------------------------------------------------------

class Placeholder(Op):
    name = "placeholder"
    def __call__(self, shape, name=None): return Node(self, [], shape=tuple(shape), name=name)
    def infer_shape(self, node):
        s = node.attrs["shape"]
        if any(d is not None and (not isinstance(d, (int, np.integer)) or d < 0) for d in s):
            raise ShapeError(f"placeholder: {s} is not a shape (sizes are ints >= 0, or None for any size)")
        return s


class Constant(Op):
    name = "constant"
    def __call__(self, value, name=None): return Node(self, [], value=np.asarray(value, dtype=np.float64), name=name)
    def infer_shape(self, node): return node.attrs["value"].shape
    def compute(self, node): return node.attrs["value"]


class Variable(Op):
    """State that lives in a Session and survives between runs; `assign` changes it."""
    name = "variable"
    def __call__(self, init, name=None): return Node(self, [], init=np.asarray(init, dtype=np.float64), name=name)
    def infer_shape(self, node): return node.attrs["init"].shape


class Assign(Op):
    name = "assign"
    def infer_shape(self, node):
        var, value = node.inputs
        if var.op.name != "variable":
            raise ShapeError(f"assign: the target must be a variable, got {var.op.name}")
        if broadcast_shape(var.shape, value.shape, "assign") != var.shape:
            raise ShapeError(f"assign: value of shape {value.shape} does not fit variable {var.name}{var.shape}")
        return var.shape
    def compute(self, node, var, value): return np.broadcast_to(value, var.shape).copy()


class OnesLike(Op):
    name = "ones_like"
    def compute(self, node, a): return np.ones_like(a)
    def gradient(self, node, g): return [None]


class ZerosLike(Op):
    name = "zeros_like"
    def compute(self, node, a): return np.zeros_like(a)
    def gradient(self, node, g): return [None]


# ---- elementwise arithmetic (broadcasting; gradients are summed back to each input's shape)

class Binary(Op):
    def infer_shape(self, node):
        return broadcast_shape(node.inputs[0].shape, node.inputs[1].shape, self.name)


class Add(Binary):
    name = "add"
    def compute(self, node, a, b): return a + b
    def gradient(self, node, g):
        a, b = node.inputs
        return [sum_to(g, a), sum_to(g, b)]


class Sub(Binary):
    name = "sub"
    def compute(self, node, a, b): return a - b
    def gradient(self, node, g):
        a, b = node.inputs
        return [sum_to(g, a), sum_to(-g, b)]


class Mul(Binary):
    name = "mul"
    def compute(self, node, a, b): return a * b
    def gradient(self, node, g): return GRADIENT_RULES["mul"](node, g)


class Div(Binary):
    name = "div"
    def compute(self, node, a, b): return a / b
    def gradient(self, node, g):
        a, b = node.inputs
        return [sum_to(g / b, a), sum_to(-g * a / (b * b), b)]


class Greater(Binary):
    """1.0 where a > b, else 0.0 (comparisons have no gradient)."""
    name = "greater"
    def compute(self, node, a, b): return (a > b).astype(np.float64)
    def gradient(self, node, g): return [None, None]


class Neg(Op):
    name = "neg"
    def compute(self, node, a): return -a
    def gradient(self, node, g): return [-g]


class Power(Op):
    """a ** p for a constant number p."""
    name = "pow"
    def compute(self, node, a): return a ** node.attrs["p"]
    def gradient(self, node, g):
        a, p = node.inputs[0], node.attrs["p"]
        return [g * p * power(a, p - 1)]


class Exp(Op):
    name = "exp"
    def compute(self, node, a): return np.exp(a)
    def gradient(self, node, g): return [g * node]


class Log(Op):
    name = "log"
    def compute(self, node, a): return np.log(a)
    def gradient(self, node, g): return [g / node.inputs[0]]


class Step(Op):
    """1 where a > 0, else 0: the derivative of relu. Its own derivative is 0 almost everywhere."""
    name = "step"
    def compute(self, node, a): return (a > 0).astype(a.dtype)
    def gradient(self, node, g): return [None]


class Relu(Op):
    name = "relu"
    def compute(self, node, a): return np.maximum(a, 0)
    def gradient(self, node, g): return [g * step(node.inputs[0])]


class Sigmoid(Op):
    name = "sigmoid"
    def compute(self, node, a): return 0.5 * (1 + np.tanh(0.5 * a))  # stable for large |a|
    def gradient(self, node, g): return [g * node * (1 - node)]


# ---- linear algebra, reductions and shapes ---------------------------------------------

class MatMul(Op):
    name = "matmul"
    def infer_shape(self, node):
        a, b = node.inputs[0].shape, node.inputs[1].shape
        if len(a) != 2 or len(b) != 2:
            raise ShapeError(f"matmul: both inputs must be 2-D, got {a} and {b}")
        if a[1] is not None and b[0] is not None and a[1] != b[0]:
            raise ShapeError(f"matmul: inner dimensions differ: {a} @ {b} ({a[1]} vs {b[0]})")
        return (a[0], b[1])
    def compute(self, node, a, b): return a @ b
    def gradient(self, node, g): return GRADIENT_RULES["matmul"](node, g)


class Transpose(Op):
    name = "transpose"
    def infer_shape(self, node):
        s = node.inputs[0].shape
        if len(s) != 2:
            raise ShapeError(f"transpose: expects a 2-D input, got {s}")
        return s[::-1]
    def compute(self, node, a): return a.T
    def gradient(self, node, g): return [transpose(g)]


class Sum(Op):
    name = "sum"
    def infer_shape(self, node):
        s = node.inputs[0].shape
        axes = axes_of(node.attrs["dim"], len(s), self.name, s)
        if node.attrs["keepdim"]:
            return tuple(1 if i in axes else d for i, d in enumerate(s))
        return tuple(d for i, d in enumerate(s) if i not in axes)
    def compute(self, node, a):
        return np.sum(a, axis=axes_of(node.attrs["dim"], a.ndim), keepdims=node.attrs["keepdim"])
    def gradient(self, node, g): return GRADIENT_RULES["sum"](node, g)


class Reshape(Op):
    name = "reshape"
    def infer_shape(self, node):
        s, new = node.inputs[0].shape, tuple(node.attrs["shape"])
        if new.count(-1) > 1 or any(not isinstance(d, (int, np.integer)) or d < -1 for d in new):
            raise ShapeError(f"reshape: {new} is not a shape (sizes are ints >= 0, with at most one -1)")
        size = int(np.prod([d for d in s if d is not None]))  # the input's size (its known part, with None)
        known = int(np.prod([d for d in new if d != -1]))      # the target's size, without the -1
        if None in s:  # the input holds `size` times an unknown number of elements
            fits = -1 in new or size == 0 or known % size == 0
        else:
            fits = size == known if -1 not in new else known > 0 and size % known == 0
        if not fits:
            elements = f"{size} elements" + (" times the unknown dimension" if None in s else "")
            raise ShapeError(f"reshape: cannot view {s} ({elements}) as {new}")
        if -1 in new and None not in s:
            new = tuple(size // known if d == -1 else d for d in new)
        return tuple(None if d == -1 else d for d in new)
    def compute(self, node, a): return a.reshape(node.attrs["shape"])
    def gradient(self, node, g): return [reshape_like(g, node.inputs[0])]


class ReshapeLike(Op):
    """Reshape a to b's run-time shape (b is only read for its shape)."""
    name = "reshape_like"
    def infer_shape(self, node): return node.inputs[1].shape
    def compute(self, node, a, b): return a.reshape(b.shape)
    def gradient(self, node, g): return [reshape_like(g, node.inputs[0]), None]


class BroadcastLike(Op):
    """Broadcast a to b's run-time shape."""
    name = "broadcast_like"
    def infer_shape(self, node):
        a, b = node.inputs[0].shape, node.inputs[1].shape
        if broadcast_shape(a, b, self.name) != b:
            raise ShapeError(f"broadcast_like: {a} does not broadcast to {b}")
        return b
    def compute(self, node, a, b): return np.broadcast_to(a, b.shape).copy()
    def gradient(self, node, g): return [sum_to(g, node.inputs[0]), None]


class SumTo(Op):
    """Sum a down to b's shape: undo broadcasting (the adjoint of BroadcastLike)."""
    name = "sum_to"
    def infer_shape(self, node): return node.inputs[1].shape
    def compute(self, node, a, b):
        lead = a.ndim - b.ndim
        a = a.sum(axis=tuple(range(lead))) if lead else a
        axes = tuple(i for i, d in enumerate(b.shape) if d == 1 and a.shape[i] != 1)
        return a.sum(axis=axes, keepdims=True) if axes else a
    def gradient(self, node, g): return [broadcast_like(g, node.inputs[0]), None]


class Softmax(Op):
    name = "softmax"
    def infer_shape(self, node):
        s = node.inputs[0].shape
        if not s:
            raise ShapeError("softmax: needs at least 1 dimension (it normalizes the last), got a scalar")
        return s
    def compute(self, node, a):
        e = np.exp(a - a.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    def gradient(self, node, g):
        s = node
        return [s * (g - reduce_sum(g * s, -1, True))]


class SoftmaxCrossEntropy(Op):
    """mean over the batch of -sum(labels * log_softmax(logits)); labels are one-hot rows."""
    name = "softmax_xent"
    def infer_shape(self, node):
        a, b = node.inputs[0].shape, node.inputs[1].shape
        if len(a) != 2 or len(b) != 2:
            raise ShapeError(f"softmax_cross_entropy: logits and labels must be (batch, classes), got {a} and {b}")
        broadcast_shape(a, b, self.name)
        return ()
    def compute(self, node, logits, labels):
        z = logits - logits.max(axis=1, keepdims=True)
        log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return np.asarray(-(labels * log_p).sum() / len(logits))
    def gradient(self, node, g):
        logits, labels = node.inputs
        n = reduce_sum(ones_like(reduce_sum(logits, 1)))  # the batch size, known at run time
        return [g * (softmax(logits) - labels) / n, None]


# One instance of each op, and the functions that build nodes with them.
placeholder, constant, variable, assign = Placeholder(), Constant(), Variable(), Assign()
ones_like, zeros_like = OnesLike(), ZerosLike()
add, sub, mul, div, neg, greater = Add(), Sub(), Mul(), Div(), Neg(), Greater()
exp, log, step, relu, sigmoid = Exp(), Log(), Step(), Relu(), Sigmoid()
matmul, transpose, softmax = MatMul(), Transpose(), Softmax()
_power, _sum, _reshape = Power(), Sum(), Reshape()
reshape_like, _broadcast_like, _sum_to = ReshapeLike(), BroadcastLike(), SumTo()
softmax_cross_entropy = SoftmaxCrossEntropy()


def power(a, p): return _power(a, p=p)


def sum_to(a, like):
    """a summed down to like's shape; no node at all when the shapes already agree."""
    return a if a.shape == like.shape else _sum_to(a, like)


def broadcast_like(a, like):
    return a if a.shape == like.shape else _broadcast_like(a, like)
def reduce_sum(a, dim=None, keepdim=False): return _sum(a, dim=dim, keepdim=keepdim)
def reshape(a, shape): return _reshape(a, shape=tuple(shape))


def reduce_mean(a, dim=None, keepdim=False):
    a = as_node(a)
    return reduce_sum(a, dim, keepdim) / reduce_sum(ones_like(a), dim, keepdim)



# ---- Node's operators, attached here where the ops are defined (as TF1's math_ops does) --

def _reshape_method(self, *shape):
    return reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)


Node.constant = staticmethod(constant)
Node.__add__ = lambda self, other: add(self, other)
Node.__radd__ = lambda self, other: add(other, self)
Node.__sub__ = lambda self, other: sub(self, other)
Node.__rsub__ = lambda self, other: sub(other, self)
Node.__mul__ = lambda self, other: mul(self, other)
Node.__rmul__ = lambda self, other: mul(other, self)
Node.__truediv__ = lambda self, other: div(self, other)
Node.__rtruediv__ = lambda self, other: div(other, self)
Node.__matmul__ = lambda self, other: matmul(self, other)
Node.__rmatmul__ = lambda self, other: matmul(other, self)
Node.__neg__ = lambda self: neg(self)
Node.__gt__ = lambda self, other: greater(self, other)
Node.__lt__ = lambda self, other: greater(other, self)
Node.__pow__ = lambda self, p: power(self, p)
Node.sum = lambda self, dim=None, keepdim=False: reduce_sum(self, dim, keepdim)
Node.mean = lambda self, dim=None, keepdim=False: reduce_mean(self, dim, keepdim)
Node.reshape = _reshape_method
Node.relu = lambda self: relu(self)
Node.exp = lambda self: exp(self)
Node.log = lambda self: log(self)
Node.sigmoid = lambda self: sigmoid(self)
Node.T = property(lambda self: transpose(self))

