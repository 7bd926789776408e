"""The adapters of course_lib.yours: how a learner's saved pieces run inside the course's libraries.

Each adapter is a module-level class, defined once here and shared by every chapter's assembly
(autograd.py for chapter 01, tensor.py for 02, ch12_capstone.py for 12). A learner's piece is always
passed in, never written into the learner's module:

- an object that holds one takes it as an argument (`OrderOfYours(topological_order)`,
  `AdamOfYours(params, adam_step)`, `EngineOfYours(pieces)`);
- a Function of the op registry, which the library applies as a class, reads the pieces of the assembly
  that is running (`pieces_in_force`, a context manager the assemblies enter in their `running()`);
- a piece that must call something else than what its own module names (your chapter 02 Mul calls
  `strided_zip`, a Python loop) runs as a copy of its code over a copy of its module's names with
  that one replaced (`rebound`).

Every adapter says whose code it runs (`whose = "yours"`), which the meter of chapter 12 reads.
"""

import contextlib
import contextvars
import functools
import math
import random
import types

import numpy as np

from course_lib.autograd import engine as scalar_engine
from course_lib.autograd import nn as scalar_nn
from course_lib.autograd import value as scalar_value
from course_lib.capstone.model import from_torch
from course_lib.tensor import Function, Tensor, optim, scalar_ops
from course_lib.tensor import functions as F
from course_lib.tensor.backend import current_backend
from course_lib.tensor.functions import unbroadcast
from course_lib.tensor.tensor_data import TensorData
from course_lib.yours.meter import current_meter

# ---- the pieces of the assembly that is running ---------------------------------------------------------

_in_force = contextvars.ContextVar("pieces_in_force", default=None)


@contextlib.contextmanager
def pieces_in_force(pieces):
    """Inside the block, the registry's adapters run these pieces ({name: function})."""
    token = _in_force.set(pieces)
    try:
        yield pieces
    finally:
        _in_force.reset(token)


def piece(name):
    """The piece `name` of the assembly that is running."""
    pieces = _in_force.get()
    if pieces is None or name not in pieces:
        raise RuntimeError(f"no piece {name!r} is in force: the adapters of course_lib.yours run inside an "
                           "assembly's running() block")
    return pieces[name]


def rebound(function, **names):
    """A copy of `function` whose code reads `names` in place of those of its module (a copy of the
    module's names, with these replaced: the module itself is not touched)."""
    namespace = dict(function.__globals__, **names)
    return types.FunctionType(function.__code__, namespace, function.__name__, function.__defaults__,
                              function.__closure__)


class Metered:
    """`function`, booked to (whose, name) on the meter measuring a step, if one is (meter.py)."""

    def __init__(self, whose, name, function):
        self.whose, self.name, self.function = whose, name, function
        self.__name__ = getattr(function, "__name__", name)

    def __call__(self, *args, **kwargs):
        meter = current_meter()
        if meter is None:
            return self.function(*args, **kwargs)
        return meter.leaf(self.whose, self.name, self.function, *args, **kwargs)


def _wrap(array, dtype):
    """A numpy result as a contiguous Tensor of `dtype` (no copy when it already is one)."""
    array = np.ascontiguousarray(array, dtype=dtype)
    return Tensor._wrap(TensorData.contiguous(array.reshape(-1), tuple(int(n) for n in array.shape)))


# ---- chapter 01 ---------------------------------------------------------------------------------------

_default_engine = contextvars.ContextVar("default_engine", default=None)


class ValueOfYours(scalar_engine.Value):
    """The course's Value, whose `*`, `exp`, `**`, `tanh`, `relu`, backward rules and backward() are the
    pieces of its engine (an EngineOfYours). A node made by an op belongs to its inputs' engine; a leaf to
    the engine given, else to the one made last. `+` and `log` are the lesson's."""

    __slots__ = ("engine",)

    def __init__(self, data, _children=(), _op="", _arg=None, label="", engine=None):
        super().__init__(data, _children, _op, _arg, label)
        self.engine = engine or (_children[0].engine if _children else _default_engine.get())

    def _lift(self, other):
        return other if isinstance(other, ValueOfYours) else ValueOfYours(other, engine=self.engine)

    def __add__(self, other):
        other = self._lift(other)
        return ValueOfYours(self.data + other.data, (self, other), "+")

    def __mul__(self, other):
        return self.engine.pieces["mul"](self, self._lift(other))

    def __pow__(self, k):
        return self.engine.pieces["power"](self, k)

    def exp(self):
        return self.engine.pieces["exp"](self)

    def tanh(self):
        return self.engine.pieces["tanh"](self)

    def relu(self):
        return self.engine.pieces["relu"](self)

    def log(self):
        return ValueOfYours(math.log(self.data), (self,), "log")

    def _backward(self):
        if self._op:
            self.engine.rules[self._op](self)

    def backward(self):
        self.engine.pieces["backward"](self)


class NeuronOfYours(scalar_nn.Neuron):
    """A neuron of ValueOfYours, called by its engine's neuron_call."""

    def __init__(self, nin, nonlin=True, engine=None):
        self.engine = engine
        self.w = [ValueOfYours(random.uniform(-1, 1), engine=engine) for _ in range(nin)]
        self.b = ValueOfYours(0, engine=engine)
        self.nonlin = nonlin

    def __call__(self, x):
        return self.engine.pieces["neuron_call"](self, x)


class LayerOfYours(scalar_nn.Layer):
    def __init__(self, nin, nout, engine=None, **kwargs):
        self.neurons = [NeuronOfYours(nin, engine=engine, **kwargs) for _ in range(nout)]


class MLPOfYours(scalar_nn.MLP):
    """The course's MLP of the engine's layers, whose parameters() is its engine's mlp_parameters."""

    def __init__(self, nin, nouts, engine=None):
        self.engine = engine
        sizes = [nin] + list(nouts)
        self.layers = [LayerOfYours(sizes[i], sizes[i + 1], engine=engine, nonlin=i != len(nouts) - 1)
                       for i in range(len(nouts))]

    def parameters(self):
        return self.engine.pieces["mlp_parameters"](self)


class EngineOfYours:
    """A scalar autograd engine of chapter 01 pieces ({name: function}).

    Your forwards build their result as `Value(...)`, the name your module imported; the engine runs
    copies of them that build a ValueOfYours instead (`rebound`). `Value` is ValueOfYours; a leaf made
    with it belongs to the engine made last (`Value(x, engine=eng)` names one)."""

    Value = ValueOfYours

    def __init__(self, pieces, yours):
        self.pieces = {name: rebound(f, Value=ValueOfYours) if name in yours else f for name, f in pieces.items()}
        self.rules = {"+": scalar_value._add_backward, "log": scalar_value._log_backward,
                      "*": self.pieces["mul_backward"], "exp": self.pieces["exp_backward"],
                      "**": self.pieces["pow_backward"], "tanh": self.pieces["tanh_backward"],
                      "relu": self.pieces["relu_backward"]}
        self.sgd_step = self.pieces["sgd_step"]
        _default_engine.set(self)

    def Neuron(self, nin, nonlin=True):
        return NeuronOfYours(nin, nonlin, engine=self)

    def Layer(self, nin, nout, **kwargs):
        return LayerOfYours(nin, nout, engine=self, **kwargs)

    def MLP(self, nin, nouts):
        return MLPOfYours(nin, nouts, engine=self)


# ---- chapter 02 -------------------------------------------------------------------------------------

class MatMulWithYourBackward(F.MatMul):
    """a @ b on the current backend; the backward is the `matmul_backward` in force (yours), in numpy."""

    whose, label = "yours", "MatMul"

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors   # numpy views of their memory (no copies): matmul_backward only reads them
        ga, gb = piece("matmul_backward")(a.data.to_numpy(), b.data.to_numpy(), grad.data.to_numpy())
        ga = unbroadcast(_wrap(ga, grad.dtype), a.shape) if ctx.needs_grad[0] else None
        gb = unbroadcast(_wrap(gb, grad.dtype), b.shape) if ctx.needs_grad[1] else None
        return ga, gb


class CrossEntropyOfYours(Function):
    """The mean cross-entropy by the `cross_entropy` in force (yours), in numpy; backward (softmax - one_hot) / N,
    the softmax exp(`log_softmax` in force). The library's cross_entropy applies it with the one-hot targets."""

    whose, label = "yours", "CrossEntropy"

    @staticmethod
    def forward(ctx, logits, one_hot):
        x = logits.numpy()
        ctx.log_p = _wrap(piece("log_softmax")(x), logits.dtype)
        ctx.one_hot, ctx.n = one_hot, x.shape[0]
        loss = piece("cross_entropy")(x, one_hot.numpy().argmax(-1))
        return TensorData.from_numpy(np.asarray(loss, dtype=logits.dtype), logits.dtype).view(())

    @staticmethod
    def backward(ctx, grad):
        return (ctx.log_p.exp() - ctx.one_hot) * (grad / float(ctx.n)), None


class FunctionOnBackend(Function):
    """Your chapter 02 Function `label` (Mul or Sum): the forward in force under "<label>.forward" (a copy of
    yours that calls the backend's loops where yours names strided_zip and strided_reduce), and your
    backward. A subclass names which."""

    whose, label = "yours", ""

    @classmethod
    def forward(cls, ctx, *inputs, **kwargs):
        return piece(f"{cls.label}.forward")(ctx, *inputs, **kwargs)

    @classmethod
    def backward(cls, ctx, grad):
        return piece(cls.label).backward(ctx, grad)


class MulOfYours(FunctionOnBackend):
    label = "Mul"


class SumOfYours(FunctionOnBackend):
    label = "Sum"


_PROBES = ((1.5, -2.25), (0.75, 3.5), (-4.0, 0.5), (2.0, 2.0))


@functools.lru_cache(maxsize=64)
def zip_op(f):
    """The backend's name of the binary op `f` computes (operator.mul -> "mul"), found by trying it."""
    for name in ("mul", "add", "sub", "div", "max"):
        if all(math.isclose(f(x, y), scalar_ops.ZIP[name](x, y)) for x, y in _PROBES):
            return name
    raise ValueError(f"your strided_zip was called with {f!r}, which is none of mul, add, sub, div, max")


@functools.lru_cache(maxsize=64)
def reduce_op(f, start):
    """The backend's name of the reduction (f, start): (operator.add, 0.0) -> "sum"."""
    if zip_op(f) == "add" and start == 0:
        return "sum"
    if zip_op(f) == "max" and start == -math.inf:
        return "max"
    raise ValueError(f"your strided_reduce was called with ({f!r}, {start!r}), neither a sum nor a max")


def backend_zip(f, a, b):
    """Your chapter 02 strided_zip(f, a, b), as the current backend's zip."""
    return current_backend().zip(zip_op(f), a, b)


def backend_reduce(f, start, a, dim):
    """Your chapter 02 strided_reduce(f, start, a, dim), as the current backend's reduce."""
    return current_backend().reduce(reduce_op(f, start), a, dim)


class AdamOfYours(optim.AdamW):
    """The library's AdamW (decoupled decay, when its groups ask for it), whose update is your chapter 02
    adam_step, in numpy, on the flat vector of all parameters. With no weight decay it is Adam."""

    def __init__(self, params, adam_step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, lr, betas, eps, weight_decay)
        self.adam_step = adam_step

    def update(self, param, grad, state):
        decay = self.per_element("weight_decay", self.weight_decay, param)
        if decay is not None:
            param = param * (1 - self.lr * decay)
        t = state["t"] = state.get("t", 0) + 1
        if t == 1:
            state["m"], state["v"] = np.zeros(param.shape, param.dtype), np.zeros(param.shape, param.dtype)
        lr = self.lr   # one number, or one per entry (a Tensor) when the groups' lrs differ
        lr = lr.numpy() if isinstance(lr, Tensor) else lr
        new, state["m"], state["v"] = self.adam_step(param.numpy(), grad.numpy(), state["m"], state["v"], t, lr,
                                                     *self.betas, self.eps)
        return _wrap(new, param.dtype)


class SGDOfYours(optim.SGD):
    """The library's SGD with momentum, whose update is your chapter 02 sgd_momentum_step."""

    def __init__(self, params, sgd_momentum_step, lr=0.01, momentum=0.0):
        super().__init__(params, lr, momentum)
        self.sgd_momentum_step = sgd_momentum_step

    def update(self, param, grad, state):
        v = state.get("v", np.zeros(param.shape, param.dtype))
        new, state["v"] = self.sgd_momentum_step(param.numpy(), grad.numpy(), v, self.lr, self.momentum)
        return _wrap(new, param.dtype)


# ---- chapter 01's order, on tensors (chapter 12) ---------------------------------------------------------

class _Node:
    """A tensor as chapter 01's topological_order walks it: `_prev`, its inputs that need a gradient."""

    __slots__ = ("tensor", "_memo")

    def __init__(self, tensor, memo):
        self.tensor, self._memo = tensor, memo

    @property
    def _prev(self):
        return tuple(_node(p, self._memo) for p in self.tensor._parents if p.requires_grad)


def _node(tensor, memo):
    """The one _Node of a tensor within one walk (a shared input is the same node each time)."""
    node = memo.get(id(tensor))
    if node is None:
        node = memo[id(tensor)] = _Node(tensor, memo)
    return node


class OrderOfYours:
    """Your chapter 01 topological_order (on nodes with `_prev`) as the order of a tensor graph."""

    whose = "yours"

    def __init__(self, topological_order):
        self.topological_order = topological_order
        self.__name__ = f"your {topological_order.__name__}"

    def __call__(self, root):
        return [node.tensor for node in self.topological_order(_node(root, {}))]


# ---- chapter 12: a GPT class of yours, made from chapter 04's weights -------------------------------------

class ModelOfYours:
    """A GPT class (yours, or the course's) that also makes a model from chapter 04's PyTorch GPT:
    `maker(config, dtype)` builds one, `maker.from_torch(torch_gpt)` loads chapter 04's weights into one."""

    def __init__(self, GPT):
        self.GPT = GPT

    def __call__(self, config, dtype=np.float32):
        return self.GPT(config, dtype)

    def from_torch(self, torch_gpt, dtype=None):
        return from_torch(self.GPT, torch_gpt, dtype)
