"""Checks for chapter 09, the inference engine: the executor, three kernels and two passes.

The oracle is onnxruntime, which runs the same ONNX nodes and graphs independently of our engine.
"""

import numpy as np
import onnxruntime as ort

from course_lib.checks import CheckFailed, assert_close, assert_equal, exercise, fmt, require, rng
from course_lib.infer.ir import Graph, Node, Value
from course_lib.infer.load import to_onnx

F32 = np.float32


def _ort(graph, feeds):
    """Run one of our Graphs in onnxruntime (the independent oracle)."""
    sess = ort.InferenceSession(to_onnx(graph).SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _node_graph(op, inputs, attrs=None, opset=17):
    """A one-node graph reading `inputs` ({name: array}) as graph inputs."""
    vals = [Value(k, v.shape, v.dtype) for k, v in inputs.items()]
    return Graph([Node(op, list(inputs), ["y"], attrs or {}, op)], vals, [Value("y", None, np.dtype(F32))], {},
                 {"": opset})


def _rand(*shape):
    return rng().uniform(-2, 2, size=shape).astype(F32)


def _sample_graph():
    """A small graph with a constant branch, a branch from the input, and two outputs.

    y = relu(x @ W + (b * 2)) ; z = tanh(y) - mean(y)   (names and sizes are random-ish)
    """
    m, k, n = (int(v) for v in rng().integers(3, 8, size=3))
    W, b = _rand(k, n), _rand(n)
    nodes = [
        Node("MatMul", ["x", "W"], ["xw"], {}, "matmul"),
        Node("Constant", [], ["two"], {"value": np.array(2.0, F32)}, "two"),
        Node("Mul", ["b", "two"], ["b2"], {}, "scale_bias"),
        Node("Add", ["xw", "b2"], ["pre"], {}, "add_bias"),
        Node("Relu", ["pre"], ["y"], {}, "relu"),
        Node("Tanh", ["y"], ["t"], {}, "tanh"),
        Node("ReduceMean", ["y"], ["mu"], {"keepdims": 1}, "mean"),
        Node("Sub", ["t", "mu"], ["z"], {}, "sub"),
    ]
    g = Graph(nodes, [Value("x", (m, k), np.dtype(F32))], [Value("y", None, np.dtype(F32)), Value("z", None, np.dtype(F32))],
              {"W": W, "b": b}, {"": 17})
    x = _rand(m, k)
    while not ((x @ W + 2 * b) > 0.1).any():   # else y = relu(.) = 0 = z, and the two outputs look alike
        x = _rand(m, k)
    return g, {"x": x}


@exercise
def execute(execute):
    """execute(graph, feeds) -> list of the graph's outputs, running nodes in a topological order."""
    g, feeds = _sample_graph()
    expected = _ort(g, feeds)
    for trial in range(3):
        shuffled = g.copy()
        # The sample graph's nodes are in topological order, so trial 0 (reversed) surely is not.
        order = np.arange(len(shuffled.nodes))[::-1] if trial == 0 else rng().permutation(len(shuffled.nodes))
        shuffled.nodes = [shuffled.nodes[i] for i in order]
        before = [n.op_type for n in shuffled.nodes]
        try:
            yours = execute(shuffled, dict(feeds))
        except KeyError as e:
            raise CheckFailed(f"your executor looked up value {e} before any node had computed it, with the nodes "
                              f"in this file order: {before}") from None
        require([n.op_type for n in shuffled.nodes] == before, "your executor reordered graph.nodes in place.",
                hint="build a new list for the schedule; leave the graph as it was.")
        require(isinstance(yours, (list, tuple)) and len(yours) == len(g.outputs),
                f"execute should return a list of {len(g.outputs)} arrays (one per graph output), got {fmt(yours)}.")
        for i, (v, y) in enumerate(zip(g.outputs, yours)):
            assert_close(y, expected[i], what=f"graph output {v.name!r} (nodes in order {before})", rtol=1e-5,
                         atol=1e-6, mistakes={"that is the other output: return them in the order of graph.outputs":
                                              expected[1 - i]})
    return "an 8-node graph in 3 shuffled orders, against onnxruntime"


@exercise
def gemm(gemm):
    """gemm(a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0), against onnxruntime's Gemm."""
    n_cases = 0
    for transA in (0, 1):
        for transB in (0, 1):
            m, k, n = (int(v) for v in rng().integers(2, 9, size=3))
            if transB and not transA:
                n = k  # square B: ignoring transB gives the right shape and wrong values
            a = _rand(k, m) if transA else _rand(m, k)
            b = _rand(n, k) if transB else _rand(k, n)
            c = _rand(n) if rng().random() < 0.5 else _rand(m, 1)
            alpha, beta = float(rng().uniform(0.5, 2)), float(rng().uniform(0.5, 2))
            attrs = {"alpha": alpha, "beta": beta, "transA": transA, "transB": transB}
            expected = _ort(_node_graph("Gemm", {"a": a, "b": b, "c": c}, attrs), {"a": a, "b": b, "c": c})[0]
            yours = gemm(a, b, c, alpha=alpha, beta=beta, transA=transA, transB=transB)
            A, B = (a.T if transA else a), (b.T if transB else b)
            mistakes = {"beta scales the bias C, alpha the product: you swapped them": beta * (A @ B) + alpha * c,
                        "alpha is missing: Y = alpha * A'B' + beta * C": A @ B + beta * c,
                        "beta is missing: Y = alpha * A'B' + beta * C": alpha * (A @ B) + c}
            if transB and B.shape == b.shape:
                mistakes["you ignored transB: with transB=1, use B transposed"] = alpha * (A @ b) + beta * c
            assert_close(yours, expected, what=f"Gemm with transA={transA}, transB={transB}", rtol=1e-4, atol=1e-5,
                         inputs={"a.shape": a.shape, "b.shape": b.shape, "c.shape": c.shape, "alpha": alpha, "beta": beta},
                         hint=None if not transB else "with transB=1, B arrives as (N, K): use its transpose.",
                         mistakes=mistakes)
            n_cases += 1
    no_c = gemm(a, b, None, alpha=alpha, beta=beta, transA=transA, transB=transB)
    assert_close(no_c, alpha * (A @ B), what="Gemm without C", rtol=1e-4, atol=1e-5,
                 hint="C is optional: when it is None, Y = alpha * A'B'.")
    return f"{n_cases + 1} cases over transA, transB, alpha, beta and a row or column bias"


@exercise
def softmax(softmax):
    """softmax(x, axis=-1) along any axis, stable for large inputs (opset 13 semantics)."""
    import torch

    shape = tuple(int(v) for v in rng().integers(2, 7, size=3))
    for axis in (-1, 0, 1, 2):
        x = rng().uniform(-3, 3, size=shape).astype(F32)
        expected = torch.softmax(torch.tensor(x, dtype=torch.float64), dim=axis).numpy()
        e = np.exp(x)
        assert_close(softmax(x, axis=axis), expected, what=f"softmax over axis {axis} of shape {shape}", rtol=1e-5,
                     atol=1e-6, mistakes={"you normalized over the last axis instead of `axis`": e / e.sum(-1, keepdims=True),
                                          "you divided by the sum over all elements, not along `axis`": e / e.sum()})
    big = (rng().uniform(-1, 1, size=(3, 5)) * 50 + 1000).astype(F32)
    expected = torch.softmax(torch.tensor(big, dtype=torch.float64), dim=-1).numpy()
    assert_close(softmax(big, axis=-1), expected, what="softmax of values near 1000", rtol=1e-5, atol=1e-6,
                 hint="exp(1000) overflows to inf: subtract the max along the axis before exp.")
    return "axes -1, 0, 1, 2 of a random 3-D tensor, and large values"


@exercise
def reshape(reshape):
    """reshape(x, shape, allowzero=0) with ONNX's 0 (copy that size) and -1 (infer) rules."""
    cases = []
    a, b, c, d = (int(v) for v in rng().choice(np.arange(2, 8), size=4, replace=False))  # distinct: a 0
    # copied from the wrong axis then gives a wrong shape
    x = _rand(a, b, c, d)
    cases = [([0, 0, -1], 0), ([0, -1], 0), ([-1, 0, 0, 0], 0), ([0, b * c, d], 0), ([0, 0, c, -1], 0), ([0, b, c * d], 0),
             ([a, -1], 0), ([a * b * c * d], 0)]
    for shape, allowzero in cases:
        target = np.array(shape, dtype=np.int64)
        expected = _ort(_node_graph("Reshape", {"x": x, "shape": target}, {"allowzero": allowzero}, opset=14),
                        {"x": x, "shape": target})[0]
        try:
            yours = reshape(x, target, allowzero=allowzero)
        except ValueError as e:
            hint = ("\n  hint: a 0 in the target copies the input's size on that axis (unless allowzero=1); "
                    "numpy takes a 0 literally.") if 0 in shape else ""
            raise CheckFailed(f"reshape of a {x.shape} tensor to {shape} raised ValueError: {e}{hint}") from None
        assert_close(yours, expected, what=f"reshape of a {x.shape} tensor to {shape}",
                     hint="a 0 copies the input's size on the same axis; one -1 takes what is left.")
    empty = np.zeros((a, 0), dtype=F32)
    allowzero_hint = "with allowzero=1 a 0 in the target means a size of 0, not 'copy'."
    try:
        yours = reshape(empty, np.array([0, a], dtype=np.int64), allowzero=1)
    except ValueError as e:
        raise CheckFailed(f"reshape of a {empty.shape} tensor to [0, {a}] with allowzero=1 raised ValueError: {e}"
                          f"\n  hint: {allowzero_hint}") from None
    assert_equal(tuple(np.shape(yours)), (0, a), what="with allowzero=1, reshape of a (a, 0) tensor to [0, a]",
                 hint=allowzero_hint)
    return f"{len(cases) + 1} targets with 0 and -1 on a random 4-D tensor"


def _constants_graph():
    """x -> ... with a constant chain (Constant, Mul, Sqrt, Add of two initializers) feeding the input branch."""
    m, n = (int(v) for v in rng().integers(3, 8, size=2))
    c1, c2 = _rand(n), rng().uniform(0.5, 2, size=n).astype(F32)
    nodes = [
        Node("Constant", [], ["k"], {"value": np.array(float(rng().uniform(1.5, 3)), F32)}, "k"),
        Node("Mul", ["c1", "k"], ["c1k"], {}, "c1_times_k"),
        Node("Sqrt", ["c2"], ["s"], {}, "sqrt_c2"),
        Node("Add", ["c1k", "s"], ["shift"], {}, "shift"),
        Node("Add", ["x", "shift"], ["xs"], {}, "x_plus_shift"),        # depends on the input: keep
        Node("Mul", ["xs", "s"], ["y"], {}, "times_s"),                  # depends on the input: keep
        Node("Neg", ["c1"], ["unused"], {}, "dead_but_constant"),
    ]
    g = Graph(nodes, [Value("x", (m, n), np.dtype(F32))], [Value("y", None, np.dtype(F32))], {"c1": c1, "c2": c2},
              {"": 17})
    return g, {"x": _rand(m, n)}


def _input_dependent(graph):
    """Names of the nodes whose output depends on a graph input."""
    tainted, names = {v.name for v in graph.inputs}, set()
    for n in graph.nodes:
        if any(i in tainted for i in n.inputs):
            tainted.update(n.outputs)
            names.add(n.name)
    return names


@exercise
def fold_constants(fold_constants):
    """fold_constants(graph) -> a new graph where every node with only constant inputs became an initializer."""
    from course_lib.infer.session import InferenceSession

    g, feeds = _constants_graph()
    before = [n.name for n in g.nodes]
    expected = _ort(g, feeds)
    try:
        folded = fold_constants(g)
    except KeyError as e:
        raise CheckFailed(f"folding looked up {e}, which is not a constant: you tried to evaluate a node that "
                          "depends on a graph input.\n  hint: a node is constant only if ALL its inputs are "
                          "initializers.") from None
    require(folded is not None, "fold_constants returned None. Return the new graph.")
    require([n.name for n in g.nodes] == before, "fold_constants changed the graph it was given.",
            hint="work on graph.copy() and return it.")
    kept = {n.name for n in folded.nodes}
    lost = sorted(_input_dependent(g) - kept)
    require(not lost, f"you folded nodes that depend on the graph input x: {lost}. Their value changes with every "
            "input, so they must stay nodes.", hint="a node is constant only if ALL its inputs are initializers.")
    left = sorted(n.name for n in folded.nodes if all(i == "" or i in folded.initializers for i in n.inputs))
    require(not left, f"nodes whose inputs are all constants are still there: {left}.",
            hint="walk the nodes in order, so a folded output makes its readers foldable in the same sweep.")
    yours = InferenceSession(folded).run(None, feeds)
    for v, y, e in zip(g.outputs, yours, expected):
        assert_close(y, e, what=f"output {v.name!r} of the folded graph", rtol=1e-5, atol=1e-6)
    return f"{len(g.nodes)} nodes folded to {len(folded.nodes)}; outputs unchanged"


def _fusion_graph():
    """Three MatMul+Add pairs: a fusable one (bias of shape (N,)), one whose product has a second reader,
    and one whose bias (2, M, N) broadcasts the product up to 3-D (Gemm cannot do that)."""
    m, k, n = (int(v) for v in rng().integers(3, 8, size=3))
    W1, W2, W3 = _rand(k, n), _rand(n, n), _rand(n, n)
    b1, b2, b3 = _rand(n), _rand(n), _rand(2, m, n)
    nodes = [
        Node("MatMul", ["x", "W1"], ["p1"], {}, "mm1"),
        Node("Add", ["p1", "b1"], ["h1"], {}, "add1"),            # fusable -> Gemm
        Node("MatMul", ["h1", "W2"], ["p2"], {}, "mm2"),
        Node("Add", ["p2", "b2"], ["h2"], {}, "add2"),            # p2 is read again below: not fusable
        Node("Tanh", ["p2"], ["t2"], {}, "tanh_p2"),
        Node("MatMul", ["h2", "W3"], ["p3"], {}, "mm3"),
        Node("Add", ["p3", "b3"], ["h3"], {}, "add3"),            # 3-D bias: not fusable into Gemm
        Node("Add", ["h3", "t2"], ["y"], {}, "out"),
    ]
    g = Graph(nodes, [Value("x", (m, k), np.dtype(F32))], [Value("y", None, np.dtype(F32))],
              {"W1": W1, "W2": W2, "W3": W3, "b1": b1, "b2": b2, "b3": b3}, {"": 17})
    return g, {"x": _rand(m, k)}


@exercise
def fuse_matmul_add(fuse_matmul_add):
    """fuse_matmul_add(graph) -> a new graph where MatMul + Add of a constant row bias is one Gemm."""
    from course_lib.infer.session import InferenceSession

    g, feeds = _fusion_graph()
    before = [n.name for n in g.nodes]
    expected = _ort(g, feeds)
    fused = fuse_matmul_add(g)
    require(fused is not None, "fuse_matmul_add returned None. Return the new graph.")
    require([n.name for n in g.nodes] == before, "fuse_matmul_add changed the graph it was given.",
            hint="work on graph.copy() and return it.")
    ops = [n.op_type for n in fused.nodes]
    require(ops.count("Gemm") >= 1, f"no Gemm in the fused graph (its ops: {ops}): the first MatMul+Add, with a "
            "bias of shape (N,), should become one Gemm.")
    try:
        yours = InferenceSession(fused).run(None, feeds)
    except Exception as e:
        raise CheckFailed(f"the fused graph does not run: {type(e).__name__}: {e}\n  hint: a MatMul output read by "
                          "another node too must stay; only fuse when the Add is its only reader.") from None
    assert_close(yours[0], expected[0], what="the output of the fused graph", rtol=1e-5, atol=1e-5,
                 hint="only fuse when the bias broadcasts along the rows, shape (N,) or (1, N): Gemm's C may not "
                      "make the output bigger, and a (2, M, N) bias does.")
    require(ops.count("Gemm") == 1, f"expected exactly one Gemm (the other two pairs cannot be fused), got ops {ops}.",
            hint="a MatMul whose output has another reader, or a bias that broadcasts to more dimensions, stays.")
    return "one pair fused, two that must not be fused left alone; output unchanged"
