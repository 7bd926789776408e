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
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: a graph input that shadows an initializer is meant here
    sess = ort.InferenceSession(to_onnx(graph).SerializeToString(), options, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _node_graph(op, inputs, attrs=None, opset=17):
    """A one-node graph reading `inputs` ({name: array}) as graph inputs."""
    vals = [Value(k, v.shape, v.dtype) for k, v in inputs.items()]
    return Graph([Node(op, list(inputs), ["y"], attrs or {}, op)], vals, [Value("y", None, np.dtype(F32))], {},
                 {"": opset})


def _rand(*shape):
    return rng().uniform(-2, 2, size=shape).astype(F32)


def _sample_graph():
    """The executor's graph. Besides a constant branch and two outputs it holds, on every draw, the
    cases a simple executor gets wrong: a 3-D activation, an input left out (Clip without its min), a
    node with two outputs (Split), and a graph input `s` that shadows an initializer of the same name.

    y = relu(x @ W + b * 2 + s) ; y0, y1 = split(clip(y, max=cap)) ; outputs y0 and tanh(y1) - mean(y0)
    """
    m, k, n = (int(v) for v in rng().integers(3, 8, size=3))
    W, b, s_default = _rand(k, n), _rand(n), _rand(n)
    cap = np.array(rng().uniform(0.8, 1.5), F32)
    nodes = [
        Node("MatMul", ["x", "W"], ["xw"], {}, "matmul"),             # x is 3-D: (2, m, k)
        Node("Constant", [], ["two"], {"value": np.array(2.0, F32)}, "two"),
        Node("Mul", ["b", "two"], ["b2"], {}, "scale_bias"),
        Node("Add", ["xw", "b2"], ["xb"], {}, "add_bias"),
        Node("Add", ["xb", "s"], ["pre"], {}, "add_s"),              # s is fed: the feed wins over the initializer
        Node("Relu", ["pre"], ["y"], {}, "relu"),
        Node("Clip", ["y", "", "cap"], ["yc"], {}, "clip_max"),       # min left out: ""
        Node("Split", ["yc"], ["y0", "y1"], {"axis": 0}, "split"),    # two outputs
        Node("Tanh", ["y1"], ["t"], {}, "tanh"),
        Node("ReduceMean", ["y0"], ["mu"], {"keepdims": 1}, "mean"),
        Node("Sub", ["t", "mu"], ["z"], {}, "sub"),
    ]
    g = Graph(nodes, [Value("x", (2, m, k), np.dtype(F32)), Value("s", (n,), np.dtype(F32))],
              [Value("y0", None, np.dtype(F32)), Value("z", None, np.dtype(F32))],
              {"W": W, "b": b, "s": s_default, "cap": cap}, {"": 17})
    x, s = _rand(2, m, k), _rand(n)
    while not ((x[0] @ W + 2 * b + s) > 0.1).any():   # else y0 = 0 and the two outputs look alike
        x = _rand(2, m, k)
    return g, {"x": x, "s": s}


_EXECUTE_HINT = ('an input named "" is left out: nothing computes it, so do not wait for it (pass it on; '
                 'run_node turns it into None); and store every output of a node: Split has two.')


@exercise
def execute(your_execute):
    """execute(graph, feeds) -> list of the graph's outputs, running nodes in a topological order."""
    g, feeds = _sample_graph()
    expected = _ort(g, feeds)
    shadowed = _ort(g, {**feeds, "s": g.initializers["s"]})  # what an executor gets when the initializer wins
    for trial in range(3):
        shuffled = g.copy()
        # The sample graph's nodes are in topological order, so trial 0 (reversed) surely is not.
        order = np.arange(len(shuffled.nodes))[::-1] if trial == 0 else rng().permutation(len(shuffled.nodes))
        shuffled.nodes = [shuffled.nodes[i] for i in order]
        before = [n.op_type for n in shuffled.nodes]
        try:
            yours = your_execute(shuffled, dict(feeds))
        except NotImplementedError:
            raise
        except KeyError as e:
            hint = _EXECUTE_HINT if e.args and e.args[0] in ("", "y1") else \
                "run a node only once every one of its (non-empty) inputs is known."
            raise CheckFailed(f"your executor looked up value {e} before any node had computed it, with the nodes "
                              f"in this file order: {before}\n  hint: {hint}") from None
        except Exception as e:
            raise CheckFailed(f"your executor raised {type(e).__name__}: {e}\n  with the nodes in this file order: "
                              f"{before}\n  hint: {_EXECUTE_HINT}") from None
        require([n.op_type for n in shuffled.nodes] == before, "your executor reordered graph.nodes in place.",
                hint="build a new list for the schedule; leave the graph as it was.")
        require(isinstance(yours, (list, tuple)) and len(yours) == len(g.outputs),
                f"execute should return a list of {len(g.outputs)} arrays (one per graph output), got {fmt(yours)}.")
        for i, (v, y) in enumerate(zip(g.outputs, yours)):
            assert_close(y, expected[i], what=f"graph output {v.name!r} (nodes in order {before})", rtol=1e-5,
                         atol=1e-6, inputs={"feeds": {k: a.shape for k, a in feeds.items()}},
                         mistakes={"that is the other output: return them in the order of graph.outputs":
                                   expected[1 - i],
                                   "you used the initializer 's' where the feed 's' was given: an initializer "
                                   "that shares a graph input's name is only a default, and a feed wins "
                                   "(seed env with the initializers first, then the feeds)": shadowed[i]})
    return ("an 11-node graph in 3 shuffled orders, against onnxruntime: a 3-D activation, a left-out input, "
            "a two-output node and a fed input shadowing an initializer")


@exercise
def gemm(your_gemm):
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
            yours = your_gemm(a, b, c, alpha=alpha, beta=beta, transA=transA, transB=transB)
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
    no_c = your_gemm(a, b, None, alpha=alpha, beta=beta, transA=transA, transB=transB)
    assert_close(no_c, alpha * (A @ B), what="Gemm without C", rtol=1e-4, atol=1e-5,
                 hint="C is optional: when it is None, Y = alpha * A'B'.")
    return f"{n_cases + 1} cases over transA, transB, alpha, beta and a row or column bias"


@exercise
def softmax(your_softmax):
    """softmax(x, axis=-1) along any axis, stable for large inputs (opset 13 semantics)."""
    import torch

    shape = tuple(int(v) for v in rng().integers(2, 7, size=3))
    for axis in (-1, 0, 1, 2):
        x = rng().uniform(-3, 3, size=shape).astype(F32)
        expected = torch.softmax(torch.tensor(x, dtype=torch.float64), dim=axis).numpy()
        e = np.exp(x)
        assert_close(your_softmax(x, axis=axis), expected, what=f"softmax over axis {axis} of shape {shape}", rtol=1e-5,
                     atol=1e-6, mistakes={"you normalized over the last axis instead of `axis`": e / e.sum(-1, keepdims=True),
                                          "you divided by the sum over all elements, not along `axis`": e / e.sum()})
    big = (rng().uniform(-1, 1, size=(3, 5)) * 50 + 1000).astype(F32)
    expected = torch.softmax(torch.tensor(big, dtype=torch.float64), dim=-1).numpy()
    assert_close(your_softmax(big, axis=-1), expected, what="softmax of values near 1000", rtol=1e-5, atol=1e-6,
                 hint="exp(1000) overflows to inf: subtract the max along the axis before exp.")
    # Fixed: rows 500 apart, so subtracting the max of the WHOLE tensor underflows exp to 0 (0/0 = nan)
    # in the lower rows; only the max along the axis, kept per row, works.
    apart = (rng().uniform(-1, 1, size=(3, 5)) + np.array([[0.0], [-500.0], [300.0]])).astype(F32)
    expected = torch.softmax(torch.tensor(apart, dtype=torch.float64), dim=-1).numpy()
    assert_close(your_softmax(apart, axis=-1), expected, what="softmax of rows 500 apart", rtol=1e-5, atol=1e-6,
                 hint="each row needs its own max along `axis`, not the max of the whole tensor: rows far "
                      "below it underflow to 0 and divide 0 by 0.")
    return "axes -1, 0, 1, 2 of a random 3-D tensor, and large values"


@exercise
def reshape(your_reshape):
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
            yours = your_reshape(x, target, allowzero=allowzero)
        except ValueError as e:
            hint = ("\n  hint: a 0 in the target copies the input's size on that axis (unless allowzero=1); "
                    "numpy takes a 0 literally.") if 0 in shape else ""
            raise CheckFailed(f"reshape of a {x.shape} tensor to {shape} raised ValueError: {e}{hint}") from None
        assert_close(yours, expected, what=f"reshape of a {x.shape} tensor to {shape}",
                     hint="a 0 copies the input's size on the same axis; one -1 takes what is left.")
    empty = np.zeros((a, 0), dtype=F32)
    allowzero_hint = "with allowzero=1 a 0 in the target means a size of 0, not 'copy'."
    try:
        yours = your_reshape(empty, np.array([0, a], dtype=np.int64), allowzero=1)
    except ValueError as e:
        raise CheckFailed(f"reshape of a {empty.shape} tensor to [0, {a}] with allowzero=1 raised ValueError: {e}"
                          f"\n  hint: {allowzero_hint}") from None
    assert_equal(tuple(np.shape(yours)), (0, a), what="with allowzero=1, reshape of a (a, 0) tensor to [0, a]",
                 hint=allowzero_hint)
    return f"{len(cases) + 1} targets with 0 and -1 on a random 4-D tensor"


def _constants_graph():
    """A constant chain feeding the input branch. On every draw it holds a left-out input (Clip without
    its min: still constant), a constant node with two outputs (Split: both must be stored), and a graph
    input `scale` that shadows an initializer (a node reading it is NOT constant)."""
    m, n = (int(v) for v in rng().integers(3, 8, size=2))
    c1, c2 = _rand(n), rng().uniform(0.5, 2, size=n).astype(F32)
    c3, scale = _rand(2, n), _rand(n)
    cap = np.array(rng().uniform(0.5, 1.5), F32)
    nodes = [
        Node("Constant", [], ["k"], {"value": np.array(float(rng().uniform(1.5, 3)), F32)}, "k"),
        Node("Mul", ["c1", "k"], ["c1k"], {}, "c1_times_k"),
        Node("Clip", ["c1k", "", "cap"], ["c1k_max"], {}, "clip_c1k"),  # min left out: still constant
        Node("Sqrt", ["c2"], ["s"], {}, "sqrt_c2"),
        Node("Split", ["c3"], ["c3a", "c3b"], {"axis": 0}, "split_c3"),  # two constant outputs
        Node("Add", ["c1k_max", "s"], ["shift"], {}, "shift"),
        Node("Sub", ["shift", "c3b"], ["shift2"], {}, "shift_minus_c3b"),
        Node("Mul", ["c2", "scale"], ["c2s"], {}, "c2_times_scale"),     # scale is a graph input: keep
        Node("Add", ["x", "shift2"], ["xs"], {}, "x_plus_shift"),        # depends on the input: keep
        Node("Mul", ["xs", "c2s"], ["xt"], {}, "times_c2s"),              # depends on the input: keep
        Node("Add", ["xt", "c3a"], ["y"], {}, "plus_c3a"),                # depends on the input: keep
        Node("Neg", ["c1"], ["unused"], {}, "dead_but_constant"),
    ]
    g = Graph(nodes, [Value("x", (m, n), np.dtype(F32)), Value("scale", (n,), np.dtype(F32))],
              [Value("y", None, np.dtype(F32))],
              {"c1": c1, "c2": c2, "c3": c3, "cap": cap, "scale": scale}, {"": 17})
    return g, {"x": _rand(m, n), "scale": _rand(n)}


def _input_dependent(graph):
    """Names of the nodes whose output depends on a graph input."""
    tainted, names = {v.name for v in graph.inputs}, set()
    for n in graph.nodes:
        if any(i in tainted for i in n.inputs):
            tainted.update(n.outputs)
            names.add(n.name)
    return names


@exercise
def fold_constants(your_fold_constants):
    """fold_constants(graph) -> a new graph where every node with only constant inputs became an initializer."""
    from course_lib.infer.session import InferenceSession

    g, feeds = _constants_graph()
    before = [n.name for n in g.nodes]
    expected = _ort(g, feeds)
    try:
        folded = your_fold_constants(g)
    except KeyError as e:
        raise CheckFailed(f"folding looked up {e}, which is not a constant: you tried to evaluate a node that "
                          "depends on a graph input.\n  hint: a node is constant only if ALL its inputs are "
                          "initializers.") from None
    require(folded is not None, "fold_constants returned None. Return the new graph.")
    require([n.name for n in g.nodes] == before, "fold_constants changed the graph it was given.",
            hint="work on graph.copy() and return it.")
    kept = {n.name for n in folded.nodes}
    lost = sorted(_input_dependent(g) - kept)
    require(not lost, f"you folded nodes that depend on a graph input: {lost}. Their value changes with every "
            "input, so they must stay nodes.",
            hint="a node is constant only if ALL its inputs are initializers (or \"\"), and an initializer that "
                 "shares its name with a graph input ('scale' here) is only a default that a feed replaces.")
    fed = {v.name for v in g.inputs}
    left = sorted(n.name for n in folded.nodes
                  if all(i == "" or (i in folded.initializers and i not in fed) for i in n.inputs))
    require(not left, f"nodes whose inputs are all constants are still there: {left}.",
            hint="walk the nodes in order, so a folded output makes its readers foldable in the same sweep; "
                 "an input named \"\" is left out, which does not stop a node from being constant.")
    try:
        yours = InferenceSession(folded).run(None, feeds)
    except Exception as e:
        raise CheckFailed(f"the folded graph does not run: {type(e).__name__}: {e}\n  hint: store EVERY output "
                          "of a folded node as an initializer (Split has two).") from None
    for v, y, e in zip(g.outputs, yours, expected):
        assert_close(y, e, what=f"output {v.name!r} of the folded graph", rtol=1e-5, atol=1e-6)
    return (f"{len(g.nodes)} nodes folded to {len(folded.nodes)}, with a left-out input, a two-output node "
            "and a fed input shadowing an initializer; outputs unchanged")


def _fusion_graph():
    """Four MatMul+Add pairs: a fusable one on a 2-D activation (bias (N,)) -> Gemm; one whose product has
    a second reader; one whose bias (2, M, N) broadcasts the product up to 3-D (cannot fuse); and, on
    every draw, one on a 3-D activation x3 with the bias on the LEFT of the Add -> MatMulAdd, since
    ONNX's Gemm takes a 2-D A only."""
    m, k, n = (int(v) for v in rng().integers(3, 8, size=3))
    W1, W2, W3, W4 = _rand(k, n), _rand(n, n), _rand(n, n), _rand(k, n)
    b1, b2, b3, b4 = _rand(n), _rand(n), _rand(2, m, n), _rand(1, n)
    nodes = [
        Node("MatMul", ["x", "W1"], ["p1"], {}, "mm1"),
        Node("Add", ["p1", "b1"], ["h1"], {}, "add1"),            # fusable -> Gemm
        Node("MatMul", ["h1", "W2"], ["p2"], {}, "mm2"),
        Node("Add", ["p2", "b2"], ["h2"], {}, "add2"),            # p2 is read again below: not fusable
        Node("Tanh", ["p2"], ["t2"], {}, "tanh_p2"),
        Node("MatMul", ["h2", "W3"], ["p3"], {}, "mm3"),
        Node("Add", ["p3", "b3"], ["h3"], {}, "add3"),            # 3-D bias: not fusable
        Node("Add", ["h3", "t2"], ["y"], {}, "out"),
        Node("MatMul", ["x3", "W4"], ["p4"], {}, "mm4"),          # x3 is 3-D
        Node("Add", ["b4", "p4"], ["h4"], {}, "add4"),            # bias first -> MatMulAdd
    ]
    g = Graph(nodes, [Value("x", (m, k), np.dtype(F32)), Value("x3", (2, m, k), np.dtype(F32))],
              [Value("y", None, np.dtype(F32)), Value("h4", None, np.dtype(F32))],
              {"W1": W1, "W2": W2, "W3": W3, "W4": W4, "b1": b1, "b2": b2, "b3": b3, "b4": b4}, {"": 17})
    return g, {"x": _rand(m, k), "x3": _rand(2, m, k)}


@exercise
def fuse_matmul_add(your_fuse_matmul_add):
    """fuse_matmul_add(graph) -> a new graph where MatMul + Add of a constant row bias is one Gemm (2-D
    activation) or one MatMulAdd (any other rank)."""
    from course_lib.infer.session import InferenceSession

    g, feeds = _fusion_graph()
    before = [n.name for n in g.nodes]
    expected = _ort(g, feeds)
    fused = your_fuse_matmul_add(g)
    require(fused is not None, "fuse_matmul_add returned None. Return the new graph.")
    require([n.name for n in g.nodes] == before, "fuse_matmul_add changed the graph it was given.",
            hint="work on graph.copy() and return it.")
    ops = [n.op_type for n in fused.nodes]
    gemms = [n for n in fused.nodes if n.op_type == "Gemm"]
    require(len(gemms) >= 1, f"no Gemm in the fused graph (its ops: {ops}): the first MatMul+Add, on the 2-D "
            "activation x with a bias of shape (N,), should become one Gemm.")
    try:
        yours = InferenceSession(fused).run(None, feeds)
    except Exception as e:
        raise CheckFailed(f"the fused graph does not run: {type(e).__name__}: {e}\n  hint: a MatMul output read by "
                          "another node too must stay; only fuse when the Add is its only reader.") from None
    for i, v in enumerate(g.outputs):
        assert_close(yours[i], expected[i], what=f"output {v.name!r} of the fused graph", rtol=1e-5, atol=1e-5,
                     hint="only fuse when the bias broadcasts along the rows, shape (N,) or (1, N): a fused node "
                          "may not make the output bigger, and a (2, M, N) bias does. The bias is the Add's "
                          "input that is NOT the product: it may come first.")
    require(not any(n.inputs and n.inputs[0] == "x3" for n in gemms),
            f"you made a Gemm of the MatMul+Add on x3, a 3-D activation (its ops: {ops}). ONNX's Gemm takes a 2-D "
            "A only, and onnxruntime rejects the file.",
            hint="check the activation's rank with value_ranks(graph): rank 2 gives Gemm, any other rank "
                 "Node('MatMulAdd', ..., domain='course').")
    require(len(gemms) == 1, f"expected exactly one Gemm (of the four pairs, only the one on x is a Gemm), got "
            f"ops {ops}.",
            hint="a MatMul whose output has another reader, or a bias that broadcasts to more dimensions, stays.")
    mma = [n for n in fused.nodes if n.op_type == "MatMulAdd"]
    require(len(mma) == 1 and mma[0].inputs == ["x3", "W4", "b4"] and mma[0].outputs == ["h4"]
            and mma[0].domain == "course",
            f"the pair h4 = Add(b4, MatMul(x3, W4)), on a 3-D activation with the bias first, should become "
            f"Node('MatMulAdd', ['x3', 'W4', 'b4'], ['h4'], domain='course'); your MatMulAdd nodes: {mma or 'none'}.",
            hint="the bias is the Add's input that is not the product (here it comes first), and the node needs "
                 "domain='course'.")
    return "a Gemm on a 2-D activation, a MatMulAdd on a 3-D one (bias first), two pairs left alone; outputs unchanged"
