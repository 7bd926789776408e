"""Every chapter 09 check passes on the reference and rejects plausible wrong implementations."""

import numpy as np
import pytest
from checking import expect_failure, expect_pass
from edits import edited

from course_lib.checks import ch09 as check
from course_lib.infer.ir import Node
from course_lib.infer.ops.linalg import gemm, softmax
from course_lib.infer.ops.shape import reshape
from course_lib.infer.passes import fuse_matmul_add, run_node  # the engine exports both from here too
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

    def global_max(x, axis=-1):  # one max for the whole tensor: rows far below it divide 0 by 0
        e = np.exp(x - x.max())
        return e / e.sum(axis=axis, keepdims=True)

    expect_failure(check.softmax, global_max, match="its own max")


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


def fold_constants(graph):
    """The reference of solutions/09: an initializer shadowed by a graph input is not a constant.
    (course_lib.infer.passes.fold_constants need not care: `load` never makes such a graph.)"""
    g = graph.copy()
    fed = {v.name for v in g.inputs}
    kept = []
    for node in g.nodes:
        if all(i == "" or (i in g.initializers and i not in fed) for i in node.inputs):
            for name, value in zip(node.outputs, run_node(g, node, g.initializers)):
                if name:
                    g.initializers[name] = value
        else:
            kept.append(node)
    g.nodes = kept
    return g


FOLDABLE = 'all(i == "" or (i in g.initializers and i not in fed) for i in node.inputs)'
# folds a node when ANY input is constant (evaluates nodes that read the graph input)
fold_any_constant = edited(fold_constants, "fold_any_constant", (FOLDABLE, "any(i in g.initializers for i in node.inputs)"))
# misses chains: a folded output does not make its reader foldable
fold_in_reverse = edited(fold_constants, "fold_in_reverse", ("for node in g.nodes:", "for node in reversed(g.nodes):"),
                         ("g.nodes = kept", "g.nodes = kept[::-1]"))


def test_fold_constants():
    expect_pass(check.fold_constants, fold_constants)
    expect_failure(check.fold_constants, fold_any_constant, match="depends on a graph input")
    expect_failure(check.fold_constants, fold_in_reverse, match="still there")

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


# ---- fixed adversarial cases (drawn on every run) ---------------------------------------------

def _kahn(graph, feeds, skip_empty=True, all_outputs=True, feeds_win=True):
    """An executor with one of three details switchable to its plausible mistake."""
    env = dict(graph.initializers) if feeds_win else dict(feeds)
    env.update(feeds if feeds_win else graph.initializers)
    pending = list(graph.nodes)
    while pending:
        ready = [n for n in pending if all((skip_empty and i == "") or i in env for i in n.inputs)]
        if not ready:
            raise ValueError("no node can run")
        for node in ready:
            outs = run_node(graph, node, env)
            for name, value in (zip(node.outputs, outs) if all_outputs else [(node.outputs[0], outs[0])]):
                env[name] = value
        pending = [n for n in pending if n not in ready]
    return [env[v.name] for v in graph.outputs]


def test_execute_fixed_cases():
    expect_pass(check.execute, _kahn)
    # waits for the left-out input "" of Clip, which never comes
    expect_failure(check.execute, lambda g, f: _kahn(g, f, skip_empty=False), match='named ""')
    # stores only the first output of Split
    expect_failure(check.execute, lambda g, f: _kahn(g, f, all_outputs=False), match="Split has two")
    # lets the initializer 's' override the feed 's'
    expect_failure(check.execute, lambda g, f: _kahn(g, f, feeds_win=False), match="a feed wins")


# folds a node that reads 'scale', an initializer that the graph input 'scale' overrides
shadowed_is_constant = edited(fold_constants, "shadowed_is_constant", (" and i not in fed", ""))
# Clip(c1k, "", cap) stays
empty_is_not_constant = edited(fold_constants, "empty_is_not_constant", ('i == "" or ', ""))
# Split's second output is lost
first_output_only = edited(fold_constants, "first_output_only",
                           ("zip(node.outputs, run_node(g, node, g.initializers))",
                            "zip(node.outputs[:1], run_node(g, node, g.initializers))"))


@pytest.mark.parametrize("wrong, hint", [(shadowed_is_constant, "only a default"), (empty_is_not_constant, "still there"),
                                         (first_output_only, "EVERY output")])
def test_fold_constants_fixed_cases(wrong, hint):
    expect_failure(check.fold_constants, wrong, match=hint)


def _fuse(graph, gemm_for_any_rank=False, bias_is_second=False):
    """The fusion with one of two plausible mistakes switchable on."""
    from course_lib.infer.passes import value_ranks
    g = graph.copy()
    readers, ranks = g.consumers(), value_ranks(g)
    fused, removed = {}, set()
    for mm in g.nodes:
        if mm.op_type != "MatMul" or mm.inputs[1] not in g.initializers:
            continue
        W = g.initializers[mm.inputs[1]]
        users = readers.get(mm.outputs[0], [])
        if W.ndim != 2 or len(users) != 1 or users[0].op_type != "Add":
            continue
        add = users[0]
        bias = add.inputs[1] if bias_is_second or add.inputs[0] == mm.outputs[0] else add.inputs[0]
        b = g.initializers.get(bias)
        if b is None or b.shape not in ((W.shape[1],), (1, W.shape[1])):
            continue
        args = ([mm.inputs[0], mm.inputs[1], bias], list(add.outputs), {}, mm.name)
        if gemm_for_any_rank or ranks.get(mm.inputs[0]) == 2:
            fused[id(mm)] = Node("Gemm", *args)
        else:
            fused[id(mm)] = Node("MatMulAdd", *args, domain="course")
            g.opsets["course"] = 1
        removed.add(id(add))
    g.nodes = [fused.get(id(n), n) for n in g.nodes if id(n) not in removed]
    return g


def test_fuse_matmul_add_fixed_cases():
    expect_pass(check.fuse_matmul_add, _fuse)
    # the former reference: a Gemm on the 3-D activation x3, which ONNX forbids
    expect_failure(check.fuse_matmul_add, lambda g: _fuse(g, gemm_for_any_rank=True), match="2-D")
    # takes the Add's second input as the bias, so Add(b4, p4) is never fused
    expect_failure(check.fuse_matmul_add, lambda g: _fuse(g, bias_is_second=True), match="bias first")
