"""Chapter 01: a scalar autograd engine with micrograd's API, and pictures of its graphs.

    value.py    the node: data, grad, the record of the op that made it; `+` and `log`; the rules table
    losses.py   the max-margin loss of micrograd's moons demo
    draw.py     a picture of the graph under a node
    engine.py   the course's answers to exercises 01.1-01.7: the other ops and backward()
    nn.py       the course's answers to exercises 01.8-01.10: Neuron, Layer, MLP and one training step

Read engine.py and nn.py once your checks pass.
"""

from course_lib.autograd.draw import draw, graph_of
from course_lib.autograd.engine import Value, topological_order
from course_lib.autograd.nn import MLP, Layer, Module, Neuron, sgd_step

__all__ = ["Value", "topological_order", "Module", "Neuron", "Layer", "MLP", "sgd_step", "draw", "graph_of"]
