"""The engine's own small IR: a graph of nodes that read and write named values.

ONNX's protobuf classes are awkward to edit, so `load` turns a model into these plain
Python objects once, and every later stage (validation, passes, execution) works on them.
"""

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Value:
    """A graph input or output: a name, a shape (ints, names for dynamic axes, or None) and a dtype."""
    name: str
    shape: tuple | None = None
    dtype: np.dtype | None = None


@dataclass
class Node:
    """One operator call: `outputs = op_type(inputs, **attrs)`. An empty input name means 'left out'."""
    op_type: str
    inputs: list
    outputs: list
    attrs: dict = field(default_factory=dict)
    name: str = ""
    domain: str = ""

    def __repr__(self):
        return f"{self.name or self.op_type}: {', '.join(self.outputs)} = {self.op_type}({', '.join(self.inputs)})"


@dataclass
class Graph:
    """Nodes in file order, graph inputs and outputs, constant tensors, and the opset per domain."""
    nodes: list
    inputs: list
    outputs: list
    initializers: dict
    opsets: dict = field(default_factory=lambda: {"": 21})
    name: str = "graph"

    @property
    def opset(self):
        return self.opsets.get("", self.opsets.get("ai.onnx", 1))

    def copy(self):
        """A copy whose node list and nodes may be edited freely (tensors are shared, never mutated)."""
        nodes = [Node(n.op_type, list(n.inputs), list(n.outputs), dict(n.attrs), n.name, n.domain) for n in self.nodes]
        return Graph(nodes, list(self.inputs), list(self.outputs), dict(self.initializers), dict(self.opsets), self.name)

    def producers(self):
        """value name -> the node that writes it."""
        return {out: n for n in self.nodes for out in n.outputs if out}

    def consumers(self):
        """value name -> the nodes that read it."""
        users = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    users.setdefault(i, []).append(n)
        return users

    def __repr__(self):
        lines = [f"Graph {self.name!r} (opset {self.opset}): {len(self.nodes)} nodes, "
                 f"{len(self.initializers)} initializers"]
        lines += [f"  input  {v.name} {v.shape} {v.dtype}" for v in self.inputs]
        lines += [f"  {n!r}" for n in self.nodes]
        lines += [f"  output {v.name}" for v in self.outputs]
        return "\n".join(lines)
