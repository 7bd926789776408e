"""Tracing: turn an eager function into a graph by running it once on placeholders.

This is the idea behind torch.fx and tf.function. The function is written against a
tensor API (methods such as @, +, .relu(), .sum(dim=...)); graph nodes offer the same
methods, so calling it on placeholders records every operation instead of computing it.
What cannot be recorded is Python control flow that depends on values: a node has no
value yet, so `if`, `float()` or `len()` on one raises TraceError.
"""

import numpy as np

from course_lib.graph import ops
from course_lib.graph.node import Graph, as_node
from course_lib.graph.session import Session


class TracedFunction:
    """A function captured as a graph: call it like the original, or optimize and draw it."""

    def __init__(self, graph, inputs, output):
        self.graph, self.inputs, self.output = graph, inputs, output

    def __call__(self, *arrays):
        return Session().run(self.output, dict(zip(self.inputs, arrays)))


def trace(fn, *examples, batch_dim=True):
    """Run fn once on placeholders shaped like the example arrays. Tensors it closes over
    (weights) become constants of the graph. With batch_dim, the first dimension of each
    input is left open (None), so the graph runs on any batch size."""
    def shape(x):
        s = np.shape(x)
        return (None,) + s[1:] if batch_dim and s else s

    with Graph() as graph:
        inputs = [ops.placeholder(shape(x), name=f"arg{i}") for i, x in enumerate(examples)]
        output = as_node(fn(*inputs))
    return TracedFunction(graph, inputs, output)
