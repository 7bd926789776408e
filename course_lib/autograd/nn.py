"""Neuron, Layer and MLP built on `Value`, with the same interface as micrograd's nn module, and one
step of gradient descent.

A neuron's sum, an MLP's parameter list and the training step are chapter 01's exercises; each is
marked with the exercise it answers: read it once your check passes.
"""

import random

from course_lib.autograd.engine import Value
from course_lib.autograd.losses import svm_loss


class Module:
    """Anything with parameters: it can list them and reset their grads."""

    def parameters(self):
        return []

    def zero_grad(self):
        for p in self.parameters():
            p.grad = 0


class Neuron(Module):
    """One unit: relu(w . x + b), or the plain weighted sum w . x + b when nonlin=False."""

    def __init__(self, nin, nonlin=True):
        self.w = [Value(random.uniform(-1, 1)) for _ in range(nin)]
        self.b = Value(0)
        self.nonlin = nonlin

    def __call__(self, x):
        """The course's answer to exercise 01.8 (`neuron_call`): read it once your check passes."""
        act = self.b
        for wi, xi in zip(self.w, x):
            act = act + wi * xi
        return act.relu() if self.nonlin else act

    def parameters(self):
        return self.w + [self.b]

    def __repr__(self):
        return f"{'ReLU' if self.nonlin else 'Linear'}Neuron({len(self.w)})"


class Layer(Module):
    """`nout` neurons reading the same inputs. A layer of one neuron returns a Value, not a list."""

    def __init__(self, nin, nout, **kwargs):
        self.neurons = [Neuron(nin, **kwargs) for _ in range(nout)]

    def __call__(self, x):
        outs = [n(x) for n in self.neurons]
        return outs[0] if len(outs) == 1 else outs

    def parameters(self):
        return [p for n in self.neurons for p in n.parameters()]

    def __repr__(self):
        return "Layer of [" + ", ".join(map(repr, self.neurons)) + "]"


class MLP(Module):
    """Layers nin -> nouts[0] -> ... -> nouts[-1]; every layer but the last applies relu."""

    def __init__(self, nin, nouts):
        sizes = [nin] + list(nouts)
        last = len(nouts) - 1
        self.layers = [Layer(sizes[i], sizes[i + 1], nonlin=i != last) for i in range(len(nouts))]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def parameters(self):
        """The course's answer to exercise 01.9 (`mlp_parameters`): read it once your check passes.

        Layer by layer, neuron by neuron, each neuron's weights then its bias (Layer.parameters and
        Neuron.parameters)."""
        return [p for layer in self.layers for p in layer.parameters()]

    def __repr__(self):
        return "MLP of [" + ", ".join(map(repr, self.layers)) + "]"


def sgd_step(model, X, y, lr):
    """The course's answer to exercise 01.10 (`sgd_step`): read it once your check passes.

    One step of gradient descent on the mean max-margin loss; returns the loss Value."""
    model.zero_grad()
    loss = svm_loss(model, X, y)
    loss.backward()
    for p in model.parameters():
        p.data -= lr * p.grad
    return loss
