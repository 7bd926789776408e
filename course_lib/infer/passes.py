"""Optimization passes. Each maps a Graph to a new Graph that computes the same outputs.

    g = fold_constants(g)          # nodes whose inputs are all constants -> initializers
    g = eliminate_dead_nodes(g)    # nodes no graph output depends on -> gone
    g = fuse_matmul_add(g)         # MatMul then Add of a bias -> one Gemm (2-D) or MatMulAdd
    g = fuse_gemm(g)               # Gemm (+ Relu) -> FusedGemm
    g = fuse_conv(g)               # Conv (+ bias Add) (+ Relu) (+ MaxPool) -> FusedConv, weights packed once
    g = fold_shapes(g, {"x": (1, 3, 8, 8)})  # Shape of a value with a static shape -> a constant

`fusions` adds two bigger ones: elementwise regions (GELU) and attention's masked softmax.

`verify(before, after, feeds)` runs both graphs, node by node with the engine's kernels, and
insists the outputs are identical.

fold_constants, fuse_matmul_add and run_graph, the executor `verify` uses, are the course's answers to
chapter 09's exercises, in answers.py (read them once your checks pass); they are importable from here.
"""

import numpy as np
import onnx

from .answers import NOT_FOLDABLE, _single_reader, fold_constants, fuse_matmul_add, run_graph  # noqa: F401
from .ir import Node
from .load import to_onnx
from .registry import bind, run_node  # noqa: F401  (run_node: one node on a dict of values)
from .shape_info import value_ranks  # noqa: F401


def eliminate_dead_nodes(graph):
    """Keep only the nodes (and initializers) that some graph output depends on."""
    g = graph.copy()
    needed = {v.name for v in g.outputs}
    kept = []
    for node in reversed(g.nodes):
        if any(o in needed for o in node.outputs):
            kept.append(node)
            needed.update(i for i in node.inputs if i)
    g.nodes = kept[::-1]
    g.initializers = {k: v for k, v in g.initializers.items() if k in needed}
    return g


def fuse_conv(graph):
    """Conv with constant weights -> FusedConv, its weights packed once, here, for conv.py's product;
    a following Add of a per-channel constant joins as its bias, a following Relu as its activation,
    and a MaxPool after those as its pool (the kernel pools first, then applies the Relu).

    The Add joins only when the Conv has no bias of its own and the constant holds one value per
    output channel, shaped to broadcast over the channel axis: (M, 1, ..., 1) or (1, M, 1, ..., 1)."""
    from .ops.conv import POOL, bias_column, pack_weights

    g = graph.copy()
    removed, replaced = set(), {}
    for conv in (n for n in g.nodes if n.op_type == "Conv"):
        w = g.initializers.get(conv.inputs[1])          # packing needs constant weights
        if w is None:
            continue
        bias = conv.inputs[2] if len(conv.inputs) > 2 else ""
        if bias and bias not in g.initializers:
            continue
        chain = [conv]                                  # the nodes that become one
        after = _single_reader(g, conv.outputs[0])
        added = ""                                      # a bias that an Add after the Conv brings
        if not bias and after is not None and after.op_type == "Add":
            other = after.inputs[1] if after.inputs[0] == conv.outputs[0] else after.inputs[0]
            b, spatial = g.initializers.get(other), (1,) * (w.ndim - 2)
            if b is not None and b.dtype == w.dtype and b.shape in ((w.shape[0],) + spatial, (1, w.shape[0]) + spatial):
                added = other
                chain.append(after)
                after = _single_reader(g, after.outputs[0])
        activation = "Relu" if after is not None and after.op_type == "Relu" else ""
        if activation:
            chain.append(after)
            after = _single_reader(g, after.outputs[0])
        pool = {}
        if after is not None and after.op_type == "MaxPool" and len(after.outputs) == 1 and w.dtype.kind == "f" \
                and after.attrs.get("storage_order", 0) == 0:
            pool = {f"pool_{k}": v for k, v in after.attrs.items() if k in POOL}
            chain.append(after)
        group = conv.attrs.get("group", 1)
        own = g.initializers[bias] if bias else None
        packed = f"{conv.inputs[1]}_packed{group}" + ("_" + bias if own is not None and group == 1 else "")
        g.initializers[packed] = pack_weights(w, group, own)   # with one group, the Conv's bias is a column of it
        inputs = [conv.inputs[0], packed]
        if added or (own is not None and group > 1):    # a bias the product does not add: a column (M, 1)
            column = (added or bias) + "_column"
            g.initializers[column] = bias_column(g.initializers[added or bias], w.dtype)
            inputs.append(column)
        attrs = {**conv.attrs, "kernel_shape": list(w.shape[2:]), "activation": activation, **pool}
        replaced[id(conv)] = Node("FusedConv", inputs, list(chain[-1].outputs), attrs,
                                  "+".join(n.name or n.op_type for n in chain), domain="course")
        removed.update(id(n) for n in chain[1:])
    g.nodes = [replaced.get(id(n), n) for n in g.nodes if id(n) not in removed]
    if replaced:
        g.opsets["course"] = 1
        read = {i for n in g.nodes for i in n.inputs} | {v.name for v in g.outputs}
        g.initializers = {k: v for k, v in g.initializers.items() if k in read}   # the unpacked weights go
    return g


def _fresh_name(name, taken):
    """`name`, or `name` with a number after it, that no value in `taken` has; added to `taken`."""
    k, fresh = 1, name
    while fresh in taken:
        k, fresh = k + 1, f"{name}{k}"
    taken.add(fresh)
    return fresh


def fuse_gemm(graph):
    """Gemm with alpha = beta = 1 and no transA -> FusedGemm, which takes a Relu that alone reads it.

    What this saves is the bookkeeping of a general Gemm and, with a Relu, a node and a temporary:
    FusedGemm adds C and applies the Relu in place on the product's own buffer. A constant C of shape
    (N,) becomes a row (1, N): the same sums, but numpy adds a row of the product's rank faster.

    B stays as the model stores it, transposed or not. Transposing it once here would spare BLAS a
    strided read, but at batch 1 numpy then takes a matrix-vector routine that sums in another order,
    and the outputs would no longer be bit for bit those of the graph before the pass."""
    g = graph.copy()
    removed, replaced, rows = set(), {}, {}   # rows: C's name -> the name of C as a row
    fed = {v.name for v in g.inputs}   # an initializer that is also a graph input is only a default
    taken = set(g.initializers) | {o for n in g.nodes for o in n.outputs} | fed
    for gemm in g.nodes:
        a = gemm.attrs
        if gemm.op_type != "Gemm" or a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
            continue
        relu = _single_reader(g, gemm.outputs[0])
        relu = relu if relu is not None and relu.op_type == "Relu" else None
        inputs = list(gemm.inputs)
        c = g.initializers.get(inputs[2]) if len(inputs) > 2 and inputs[2] not in fed else None
        if c is not None and c.ndim == 1:   # a row (1, N): numpy adds it to the product faster than an (N,)
            if inputs[2] not in rows:
                rows[inputs[2]] = _fresh_name(inputs[2] + "_row", taken)
                g.initializers[rows[inputs[2]]] = c.reshape(1, -1)
            inputs[2] = rows[inputs[2]]
        replaced[id(gemm)] = Node("FusedGemm", inputs, list((relu or gemm).outputs),
                                  {"transB": a.get("transB", 0), "activation": "Relu" if relu else ""},
                                  (gemm.name or "Gemm") + ("+Relu" if relu else ""), domain="course")
        if relu:
            removed.add(id(relu))
    g.nodes = [replaced.get(id(n), n) for n in g.nodes if id(n) not in removed]
    if replaced:
        g.opsets["course"] = 1
        read = {i for n in g.nodes for i in n.inputs} | {v.name for v in g.outputs}
        g.initializers = {k: v for k, v in g.initializers.items() if k in read}   # the biases as they were go
    return g


def static_shapes(graph, input_shapes):
    """value name -> shape, for every value whose shape is fully known once inputs have `input_shapes`."""
    g = graph.copy()
    g.inputs = [type(v)(v.name, tuple(input_shapes.get(v.name, v.shape)), v.dtype) for v in g.inputs]
    model = onnx.shape_inference.infer_shapes(to_onnx(g), data_prop=True)
    shapes = {}
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            shapes[vi.name] = tuple(d.dim_value for d in t.shape.dim)
    shapes.update({k: v.shape for k, v in g.initializers.items()})
    return g, shapes


def fold_shapes(graph, input_shapes):
    """With static input shapes, every Shape node of a fully known value is a constant: fold it, and
    then the whole subgraph that computes reshape targets from it (Gather, Concat, Unsqueeze...).
    Folding makes more reshape targets constant, so more shapes become known: repeat until stable."""
    g = graph
    for _ in range(8):
        g, shapes = static_shapes(g, input_shapes)
        kept = []
        for node in g.nodes:
            if node.op_type == "Shape" and node.inputs[0] in shapes:
                dims = shapes[node.inputs[0]][node.attrs.get("start", 0):node.attrs.get("end", None)]
                g.initializers[node.outputs[0]] = np.array(dims, dtype=np.int64)
            elif node.op_type == "Size" and node.inputs[0] in shapes:
                g.initializers[node.outputs[0]] = np.array(int(np.prod(shapes[node.inputs[0]])), dtype=np.int64)
            else:
                kept.append(node)
        done = len(kept) == len(g.nodes)
        g.nodes = kept
        g = eliminate_dead_nodes(fold_constants(g))
        if done:
            return g
    return g


def optimize(graph, input_shapes=None):
    """All passes in a sensible order: shapes, constants, fusions, then sweep the dead."""
    from .fusions import fuse_elementwise, fuse_masked_softmax

    g = graph
    if input_shapes:
        g = fold_shapes(g, input_shapes)
    g = fold_constants(g)
    g = fuse_matmul_add(g)
    g = fuse_gemm(g)
    g = fuse_conv(g)
    g = fuse_masked_softmax(g)
    g = fuse_elementwise(g)
    return eliminate_dead_nodes(g)


def verify(before, after, feeds, exact=True, rtol=1e-6, atol=1e-6):
    """Run both graphs on `feeds`; raise AssertionError unless every output is the same."""
    a, b = run_graph(before, feeds), run_graph(after, feeds)
    for v, x, y in zip(before.outputs, a, b):
        same = np.array_equal(x, y) if exact else np.allclose(x, y, rtol=rtol, atol=atol)
        if not same or x.dtype != y.dtype:
            raise AssertionError(f"output {v.name!r} changed: max |diff| {np.max(np.abs(x - y)):.3g}")
    return True
