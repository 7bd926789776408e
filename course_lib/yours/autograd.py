"""Chapter 01 assembled from your pieces: a scalar autograd engine whose ops, rules and training are yours.

    from course_lib.yours import autograd
    eng = autograd.engine()            # one line says which pieces are yours
    model = eng.MLP(2, [12, 12, 1])
    loss = eng.sgd_step(model, X, y, lr=0.5)

`eng.Value` is the course's Value with your `*`, `exp`, `**`, `tanh` and `relu` (forward and backward
rule), and your `backward()` (your topological order inside). `eng.MLP` calls your neurons and lists
its parameters with your `mlp_parameters`; `eng.sgd_step` is yours. Only `+` and `log`, which the
lesson wrote, are the course's.
"""

import math
import random
from types import SimpleNamespace

from course_lib import yours
from course_lib.autograd import engine as course
from course_lib.autograd import nn, value

# The course's version of each piece, used where yours is not saved. Its forwards make a node of
# their input's class, as yours do through the name `Value`.
COURSE = {
    "mul": lambda a, b: type(a)(a.data * b.data, (a, b), "*"), "mul_backward": course.Value._mul_backward,
    "exp": lambda a: type(a)(math.exp(a.data), (a,), "exp"), "exp_backward": course.Value._exp_backward,
    "power": lambda a, k: type(a)(a.data**k, (a,), "**", k), "pow_backward": course.Value._pow_backward,
    "tanh": lambda a: type(a)(math.tanh(a.data), (a,), "tanh"), "tanh_backward": course.Value._tanh_backward,
    "relu": lambda a: type(a)(max(a.data, 0), (a,), "relu"), "relu_backward": course.Value._relu_backward,
    "topological_order": course.topological_order,
    "backward": course.Value.backward,
    "neuron_call": nn.Neuron.__call__,
    "mlp_parameters": nn.MLP.parameters,
    "sgd_step": nn.sgd_step,
}


class ValueOfYours(course.Value):
    """The course's Value, whose ops, rules and backward() are the `pieces` of the assembly's subclass.

    Your forwards build their result as `Value(...)`, a name of your module: the assembly points it at
    its subclass, so every node of a graph is of that class. `+` and `log` are the course's."""

    __slots__ = ()
    pieces = {}   # {piece name: function}, set by the assembly's subclass (engine())
    RULES = {}    # op -> its backward rule, likewise

    def __add__(self, other):
        other = other if isinstance(other, type(self)) else type(self)(other)
        return type(self)(self.data + other.data, (self, other), "+")

    def __mul__(self, other):
        return self.pieces["mul"](self, other if isinstance(other, type(self)) else type(self)(other))

    def __pow__(self, k):
        return self.pieces["power"](self, k)

    def exp(self):
        return self.pieces["exp"](self)

    def tanh(self):
        return self.pieces["tanh"](self)

    def relu(self):
        return self.pieces["relu"](self)

    def log(self):
        return type(self)(math.log(self.data), (self,), "log")

    def _backward(self):
        if self._op:
            self.RULES[self._op](self)

    def backward(self):
        self.pieces["backward"](self)


def rules(p):
    """Each op's backward rule: yours, but for the lesson's `+` and `log`."""
    return {"+": value._add_backward, "log": value._log_backward, "*": p["mul_backward"],
            "exp": p["exp_backward"], "**": p["pow_backward"], "tanh": p["tanh_backward"], "relu": p["relu_backward"]}


class NeuronOfYours(nn.Neuron):
    """A neuron of `Value`s (the assembly's), called by your neuron_call (the subclass's __call__)."""

    Value = ValueOfYours

    def __init__(self, nin, nonlin=True):
        self.w = [self.Value(random.uniform(-1, 1)) for _ in range(nin)]
        self.b = self.Value(0)
        self.nonlin = nonlin


class LayerOfYours(nn.Layer):
    Neuron = NeuronOfYours

    def __init__(self, nin, nout, **kwargs):
        self.neurons = [self.Neuron(nin, **kwargs) for _ in range(nout)]


class MLPOfYours(nn.MLP):
    """The course's MLP of the assembly's layers, whose parameters() is your mlp_parameters."""

    Layer = LayerOfYours

    def __init__(self, nin, nouts):
        sizes = [nin] + list(nouts)
        self.layers = [self.Layer(sizes[i], sizes[i + 1], nonlin=i != len(nouts) - 1) for i in range(len(nouts))]


def engine(quiet=False):
    """Value, MLP and sgd_step made of your chapter 01 pieces (the course's where yours are not saved).

    Each class is a subclass of the one above that holds only its pieces, so that two engines (yours and
    the course's, say) live side by side."""
    p = yours.pieces("01", reference=COURSE, quiet=quiet)
    Value = type("Value", (ValueOfYours,), {"__slots__": (), "pieces": p, "RULES": rules(p)})
    for piece in p.values():  # your forwards build `Value(...)`: make that this class
        if getattr(piece, "__module__", None) == "course_yours_ch01":
            piece.__globals__["Value"] = Value
    Neuron = type("Neuron", (NeuronOfYours,), {"Value": Value, "__call__": p["neuron_call"]})
    Layer = type("Layer", (LayerOfYours,), {"Neuron": Neuron})
    MLP = type("MLP", (MLPOfYours,), {"Layer": Layer, "parameters": p["mlp_parameters"]})
    return SimpleNamespace(Value=Value, Neuron=Neuron, Layer=Layer, MLP=MLP, sgd_step=p["sgd_step"], pieces=p)
