"""Chapter 01 assembled from your pieces: a scalar autograd engine whose ops, rules and training are yours.

    from course_lib.yours import autograd
    eng = autograd.engine()            # one line says which pieces are yours
    model = eng.MLP(2, [12, 12, 1])
    loss = eng.sgd_step(model, X, y, lr=0.5)

`eng.Value` is the course's Value with your `*`, `exp`, `**`, `tanh` and `relu` (forward and backward
rule), and your `backward()` (your topological order inside). `eng.MLP` calls your neurons and lists
its parameters with your `mlp_parameters`; `eng.sgd_step` is yours. Only `+` and `log`, which the
lesson wrote, are the course's. The classes that hold your pieces are in adapters.py.
"""

import math

from course_lib import yours
from course_lib.autograd import engine as course
from course_lib.autograd import nn
from course_lib.yours.adapters import EngineOfYours

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


def engine(quiet=False):
    """An engine of your chapter 01 pieces (the course's where yours are not saved): `eng.Value`, `eng.MLP`,
    `eng.Neuron`, `eng.Layer`, `eng.sgd_step` (adapters.EngineOfYours)."""
    p = yours.pieces("01", reference=COURSE, quiet=quiet)
    return EngineOfYours(p, yours=[name for name, f in p.items() if f is not COURSE[name]])
