"""Every chapter 09 check passes on the reference and rejects plausible wrong implementations."""

import numpy as np
import pytest

from checking import expect_failure, expect_pass
from course_lib.checks import ch09 as check
from course_lib.infer.ir import Node
from course_lib.infer.ops.linalg import gemm, softmax
from course_lib.infer.ops.shape import reshape
from course_lib.infer.passes import fold_constants, fuse_matmul_add, run_node
from course_lib.infer.schedule import topological_order


def _execute(order_fn):
    def execute(graph, feeds):
        env = dict(graph.initializers)
        env.update(feeds)
        for node in order_fn(graph):
            for name, v in zip(node.outputs, run_node(graph, node, env)):
                env[name] = v
        return [env[v.name] for v in graph.outputs]
    return execute


def test_execute():
    expect_pass(check.execute, _execute(topological_order))
    expect_failure(check.execute, _execute(lambda g: g.nodes), match="before any node had computed it")
    reversed_outputs = lambda g, f: _execute(topological_order)(g, f)[::-1]
    expect_failure(check.execute, reversed_outputs, match="other output")

    def sorts_in_place(graph, feeds):
        graph.nodes[:] = topological_order(graph)
        return _execute(topological_order)(graph, feeds)
    expect_failure(check.execute, sorts_in_place, match="in place")


def test_gemm():
    expect_pass(check.gemm, gemm)

    def no_trans_b(a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
        return gemm(a, b, c, alpha=alpha, beta=beta, transA=transA, transB=0) if a.shape[1 - transA] == b.shape[0] \
            else gemm(a, b.T, c, alpha=alpha, beta=beta, transA=transA, transB=0) * 0 + 1
    expect_failure(check.gemm, no_trans_b)

    def swapped(a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
        return gemm(a, b, c, alpha=beta, beta=alpha, transA=transA, transB=transB)
    expect_failure(check.gemm, swapped, match="swapped")

    def no_alpha(a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
        return gemm(a, b, c, alpha=1.0, beta=beta, transA=transA, transB=transB)
    expect_failure(check.gemm, no_alpha, match="alpha is missing")

    def c_required(a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
        return gemm(a, b, c if c is not None else np.ones(1, np.float32), alpha=alpha, beta=beta, transA=transA, transB=transB)
    expect_failure(check.gemm, c_required, match="optional")


def test_gemm_names_ignored_transb():
    """With a square B, ignoring transB gives a right-shaped wrong answer; the hint names transB."""
    def no_trans_b(a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
        return gemm(a, b, c, alpha=alpha, beta=beta, transA=transA, transB=0)
    msg = expect_failure(check.gemm, no_trans_b)
    assert "transB" in msg


def test_softmax():
    expect_pass(check.softmax, softmax)
    last_axis = lambda x, axis=-1: softmax(x, axis=-1)
    expect_failure(check.softmax, last_axis, match="last axis")

    def unstable(x, axis=-1):
        with np.errstate(all="ignore"):
            e = np.exp(x)
            return e / e.sum(axis=axis, keepdims=True)
    expect_failure(check.softmax, unstable, match="subtract the max")


def test_reshape():
    expect_pass(check.reshape, reshape)
    literal_zero = lambda x, shape, allowzero=0: x.reshape([int(s) for s in shape])
    expect_failure(check.reshape, literal_zero, match="0 in the target")

    def zero_from_last(x, shape, allowzero=0):
        shape = [x.shape[-1] if s == 0 else int(s) for s in shape]
        return x.reshape(shape)
    expect_failure(check.reshape, zero_from_last)

    def ignores_allowzero(x, shape, allowzero=0):
        return reshape(x, shape, allowzero=0)
    expect_failure(check.reshape, ignores_allowzero, match="allowzero")


def _fold_any_constant(graph):
    """Wrong: folds a node when ANY input is constant (evaluates nodes that read the graph input)."""
    g = graph.copy()
    kept = []
    for node in topological_order(g):
        if any(i in g.initializers for i in node.inputs) or not node.inputs:
            for name, v in zip(node.outputs, run_node(g, node, g.initializers)):
                g.initializers[name] = v
        else:
            kept.append(node)
    g.nodes = kept
    return g


def test_fold_constants():
    expect_pass(check.fold_constants, fold_constants)
    expect_failure(check.fold_constants, _fold_any_constant, match="depends on a graph input")

    def one_sweep_in_reverse(graph):  # misses chains: a folded output does not make its reader foldable
        g = graph.copy()
        kept = []
        for node in reversed(g.nodes):
            if all(i in g.initializers for i in node.inputs):
                for name, v in zip(node.outputs, run_node(g, node, g.initializers)):
                    g.initializers[name] = v
            else:
                kept.append(node)
        g.nodes = kept[::-1]
        return g
    expect_failure(check.fold_constants, one_sweep_in_reverse, match="still there")

    def in_place(graph):
        folded = fold_constants(graph)
        graph.nodes = folded.nodes
        return folded
    expect_failure(check.fold_constants, in_place, match="changed the graph")


def _fuse_everything(graph):
    """Wrong: fuses every MatMul followed by Add, whatever the bias and other readers."""
    g = graph.copy()
    users = g.consumers()
    removed, out = set(), []
    for n in g.nodes:
        if id(n) in removed:
            continue
        if n.op_type == "MatMul":
            add = next((u for u in users.get(n.outputs[0], []) if u.op_type == "Add"), None)
            if add is not None:
                bias = [i for i in add.inputs if i != n.outputs[0]][0]
                out.append(Node("Gemm", [n.inputs[0], n.inputs[1], bias], list(add.outputs), {}, n.name))
                removed.add(id(add))
                continue
        out.append(n)
    g.nodes = out
    return g


def test_fuse_matmul_add():
    expect_pass(check.fuse_matmul_add, fuse_matmul_add)
    expect_failure(check.fuse_matmul_add, _fuse_everything, match="does not run")
    expect_failure(check.fuse_matmul_add, lambda g: g.copy(), match="no Gemm")

    def ignores_bias_shape(graph):  # checks the second reader, not the bias broadcast
        g = graph.copy()
        for n in g.nodes:
            if n.op_type == "Add" and n.inputs[1] in g.initializers and g.initializers[n.inputs[1]].ndim == 3:
                b = n.inputs[1]
                g.initializers[b + "_as_row"] = g.initializers[b][0, 0]
        fused = fuse_matmul_add(g)
        for n in fused.nodes:
            if n.op_type == "Add" and n.inputs[1] + "_as_row" in fused.initializers:
                n.inputs[1] = n.inputs[1] + "_as_row"  # dropped the broadcast: a (2, M, N) bias became (N,)
        return fused
    expect_failure(check.fuse_matmul_add, ignores_bias_shape)


@pytest.mark.parametrize("name", ["execute", "gemm", "softmax", "reshape", "fold_constants", "fuse_matmul_add"])
def test_untouched_stub_fails(name):
    def stub(*args, **kwargs):
        raise NotImplementedError
    expect_failure(getattr(check, name), stub, match="not implemented")
