"""Chapter 01: a scalar autograd engine with micrograd's API, and pictures of its graphs."""

from course_lib.autograd.draw import draw, graph_of
from course_lib.autograd.engine import Value, topological_order
from course_lib.autograd.nn import MLP, Layer, Module, Neuron

__all__ = ["Value", "topological_order", "Module", "Neuron", "Layer", "MLP", "draw", "graph_of"]
