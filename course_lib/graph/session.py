"""Running a graph: Session.run(fetches, feed_dict) evaluates just what the fetches need."""

import numpy as np

from course_lib.graph.node import Node
from course_lib.graph.order import topological_order


class FeedError(ValueError):
    """A placeholder was not fed, or was fed a value of the wrong shape."""


class Session:
    """The course's answer to exercise 03.2 (`run_graph`): read it once your check passes.

    Holds the variables' current values; each run computes the fetches from the feeds."""

    def __init__(self):
        self.state = {}  # variable node -> its current value

    def value_of(self, var):
        if var not in self.state:
            self.state[var] = var.attrs["init"].copy()
        return self.state[var]

    def run(self, fetches, feed_dict=None):
        """fetches: a node, or a list/tuple of nodes. Returns numpy values in the same structure."""
        single = isinstance(fetches, Node)
        wanted = [fetches] if single else list(fetches)
        feeds = {node: np.asarray(v, dtype=np.float64) for node, v in (feed_dict or {}).items()}
        values = {}
        for node in topological_order(wanted):
            values[node] = self._evaluate(node, values, feeds)
        out = [values[n] for n in wanted]
        return out[0] if single else type(fetches)(out) if isinstance(fetches, tuple) else out

    def _evaluate(self, node, values, feeds):
        kind = node.op.name
        if kind == "placeholder":
            if node not in feeds:
                raise FeedError(f"placeholder {node.name} of shape {node.shape} needs a value: "
                                f"pass it in feed_dict={{{node.name}: array}}")
            value = feeds[node]
            if value.ndim != len(node.shape) or any(d is not None and d != v for d, v in zip(node.shape, value.shape)):
                raise FeedError(f"placeholder {node.name} expects shape {node.shape} (None = any size), "
                                f"but was fed shape {value.shape}")
            return value
        if kind == "variable":
            return self.value_of(node)
        result = node.op.compute(node, *[values[i] for i in node.inputs])
        if kind == "assign":
            self.state[node.inputs[0]] = result
        return result
