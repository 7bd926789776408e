"""The course's answers to chapter 09's exercises on graphs: the executor, constant folding and the
MatMul + Add fusion. passes.py runs them among the engine's passes; read them once your checks pass.
(The kernels of exercises 09.2 to 09.4 are ops/linalg.py's gemm and softmax and ops/shape.py's reshape.)
"""

import numpy as np

from .ir import Node
from .registry import run_node
from .schedule import topological_order
from .shape_info import value_ranks
from .validate import check_feeds, check_graph

# Ops whose output is not a function of their inputs alone: never fold them.
NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"}


def run_graph(graph, feeds):
    """The course's answer to exercise 09.1 (`execute`): read it once your check passes.

    Every graph output computed from `feeds`, one node at a time in topological order."""
    check_graph(graph)
    check_feeds(graph, feeds)
    env = {**graph.initializers, **feeds}
    for node in topological_order(graph):
        for name, value in zip(node.outputs, run_node(graph, node, env)):
            if name:
                env[name] = np.asarray(value)
    return [env[v.name] for v in graph.outputs]


def fold_constants(graph):
    """The course's answer to exercise 09.5 (`fold_constants`): read it once your check passes.

    Evaluate, once, every node whose inputs are all known constants; store results as initializers."""
    g = graph.copy()
    kept = []
    for node in topological_order(g):  # producers first, so constants propagate in one sweep
        if node.op_type not in NOT_FOLDABLE and all(i == "" or i in g.initializers for i in node.inputs):
            for name, value in zip(node.outputs, run_node(g, node, g.initializers)):
                if name:
                    g.initializers[name] = np.asarray(value)
        else:
            kept.append(node)
    g.nodes = kept
    return g


def _single_reader(graph, value):
    readers = graph.consumers().get(value, [])
    outputs = {v.name for v in graph.outputs}
    return readers[0] if len(readers) == 1 and value not in outputs else None


def fuse_matmul_add(graph):
    """The course's answer to exercise 09.6 (`fuse_matmul_add`): read it once your check passes.

    MatMul(A, W) read only by Add(., b), with W and b constants -> Gemm(A, W, b) or MatMulAdd.

    The bias must broadcast along the rows of the product: shape (N,) or (1, N), N = W's columns.
    Gemm needs A of rank 2; for other ranks (a transformer's (B, T, C) activations) we emit MatMulAdd.
    """
    g = graph.copy()
    ranks = value_ranks(g)
    removed, replaced = set(), {}
    for mm in g.nodes:
        if mm.op_type != "MatMul" or mm.inputs[1] not in g.initializers:
            continue
        w = g.initializers[mm.inputs[1]]
        add = _single_reader(g, mm.outputs[0])
        if w.ndim != 2 or add is None or add.op_type != "Add":
            continue
        bias = add.inputs[1] if add.inputs[0] == mm.outputs[0] else add.inputs[0]
        b = g.initializers.get(bias)
        if b is None or b.shape not in ((w.shape[1],), (1, w.shape[1])):
            continue  # a bias that is not one row would broadcast differently: leave it alone
        if ranks.get(mm.inputs[0]) == 2:
            fused = Node("Gemm", [mm.inputs[0], mm.inputs[1], bias], list(add.outputs), {}, mm.name + "+Add")
        else:
            fused = Node("MatMulAdd", [mm.inputs[0], mm.inputs[1], bias], list(add.outputs), {},
                         mm.name + "+Add", domain="course")
        replaced[id(mm)] = fused
        removed.add(id(add))
    g.nodes = [replaced.get(id(n), n) for n in g.nodes if id(n) not in removed]
    if any(n.domain == "course" for n in g.nodes):
        g.opsets["course"] = 1
    return g
