"""Chapter 09's fast convolution, the Conv and Gemm fusions, and buffers from the memory plan.

Oracles: onnxruntime for the values; the unfused graph (bit for bit) for the fusions; a session
without planned buffers (bit for bit) for the memory plan. The plan tests also break the plan on
purpose (a lifetime that ignores views) to show that they catch it.
"""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx_models import onnx_model

from course_lib.infer import Graph, InferenceSession, Node, Value, load, memory, passes
from course_lib.infer.ops import conv as conv_ops

F = TensorProto.FLOAT


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---- the convolution kernel ------------------------------------------------------------------

CASES = [  # (x shape, w shape, attributes): 1-D, 2-D and 3-D; strides, dilations, pads, groups, auto_pad
    ((2, 3, 11), (4, 3, 3), dict(pads=[1, 2], strides=[2])),
    ((3, 4, 7, 9), (6, 2, 3, 2), dict(pads=[1, 0, 2, 1], dilations=[2, 1], group=2)),
    ((2, 2, 5, 6, 4), (3, 2, 2, 3, 2), dict(strides=[1, 2, 1], pads=[0, 1, 1, 0, 1, 0])),
    ((1, 3, 9, 8), (5, 3, 3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    ((2, 5, 6, 7), (5, 1, 3, 3), dict(auto_pad="SAME_LOWER", group=5)),
]


@pytest.mark.parametrize("windows_from", [0, 10**9])   # every column built by window copies, or by one gather
@pytest.mark.parametrize("x_shape, w_shape, attrs", CASES)
def test_conv_matches_onnxruntime_both_ways_of_building_columns(monkeypatch, windows_from, x_shape, w_shape, attrs):
    monkeypatch.setattr(conv_ops, "WINDOWS_FROM", windows_from)
    conv_ops.conv_plan.cache_clear()
    rng = np.random.default_rng(len(x_shape) * 10 + len(attrs))
    x, w, b = _rand(rng, *x_shape), _rand(rng, *w_shape), _rand(rng, w_shape[0])
    model = onnx_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)],
                   [("x", F, list(x.shape)), ("w", F, list(w.shape)), ("b", F, [w_shape[0]])], [("y", F)], {})
    feeds = {"x": x, "w": w, "b": b}
    ours, = InferenceSession(model).run(None, feeds)
    np.testing.assert_allclose(ours, _ort(model, feeds)[0], rtol=1e-4, atol=1e-4)
    conv_ops.conv_plan.cache_clear()


def test_conv_transpose_matches_onnxruntime():
    rng = np.random.default_rng(5)
    for attrs, x_shape in ((dict(strides=[2, 3], pads=[1, 0, 0, 1], output_padding=[1, 0]), (2, 4, 5, 4)),
                           (dict(group=2, dilations=[2, 1]), (1, 4, 3, 6)),
                           (dict(strides=[2], auto_pad="SAME_UPPER"), (3, 4, 7))):
        w = _rand(rng, 4, 3, *([3, 2] if len(x_shape) == 4 else [3]))
        x = _rand(rng, *x_shape)
        model = onnx_model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], **attrs)],
                       [("x", F, list(x.shape)), ("w", F, list(w.shape))], [("y", F)], {})
        ours, = InferenceSession(model).run(None, {"x": x, "w": w})
        np.testing.assert_allclose(ours, _ort(model, {"x": x, "w": w})[0], rtol=1e-4, atol=1e-4)


# ---- the Conv fusion ---------------------------------------------------------------------------

def _conv_chain(bias_as_add=False, group=1, relu=True, pool=True, pool_output_too=False):
    """Conv (bias inside, or as an Add after), Relu, MaxPool: the chapter 08 CNN's layer, by hand."""
    rng = np.random.default_rng(group * 7 + bias_as_add)
    w, b = _rand(rng, 6, 4 // group, 3, 3), _rand(rng, 6)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w"] + ([] if bias_as_add else ["b"]), ["c"], pads=[1, 1, 1, 1], group=group)]
    consts = {"w": w, "b": b.reshape(1, 6, 1, 1) if bias_as_add else b}
    last = "c"
    if bias_as_add:
        nodes.append(n("Add", ["c", "b"], ["cb"]))
        last = "cb"
    if relu:
        nodes.append(n("Relu", [last], ["r"]))
        last = "r"
    if pool:
        nodes.append(n("MaxPool", [last], ["y"], kernel_shape=[2, 2], strides=[2, 2]))
        last = "y"
    outputs = [(last, F)] + ([("r", F)] if pool_output_too else [])
    feeds = {"x": _rand(rng, 5, 4, 8, 6)}
    return onnx_model(nodes, [("x", F, [None, 4, 8, 6])], outputs, consts), feeds


@pytest.mark.parametrize("variant, expect", [
    (dict(), ["FusedConv"]),
    (dict(bias_as_add=True), ["FusedConv"]),
    (dict(group=2), ["FusedConv"]),
    (dict(pool=False), ["FusedConv"]),
    (dict(relu=False), ["FusedConv"]),
    (dict(pool_output_too=True), ["FusedConv", "MaxPool"]),   # the Relu's output is also a graph output
])
def test_conv_fusion_is_exact_and_matches_onnxruntime(variant, expect):
    model, feeds = _conv_chain(**variant)
    g = load(model)
    fused = passes.fuse_conv(g)
    assert [nd.op_type for nd in fused.nodes] == expect
    assert passes.verify(g, fused, feeds)                         # the same bits as the unfused graph
    for ours, ref in zip(InferenceSession(fused).run(None, feeds), _ort(model, feeds)):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
    conv = fused.nodes[0]
    assert conv.attrs["activation"] == ("Relu" if variant.get("relu", True) else "")
    assert ("pool_kernel_shape" in conv.attrs) == (variant.get("pool", True) and not variant.get("pool_output_too"))


def test_conv_weights_are_packed_once_when_the_session_is_made(monkeypatch):
    model, feeds = _conv_chain()
    sess = InferenceSession(model, optimize=True, input_shapes={"x": feeds["x"].shape})
    node = sess.graph.nodes[0]
    packed = sess.graph.initializers[node.inputs[1]]
    assert packed.shape == (1, 6, 4 * 9 + 1) and packed.flags.c_contiguous   # the bias is the last column
    assert "w" not in sess.graph.initializers                                # the unpacked weights are gone
    calls = []
    monkeypatch.setattr(conv_ops, "pack_weights", lambda *a: calls.append(a))
    sess.run(None, feeds)
    assert not calls                                                         # running packs nothing


def test_gemm_fusion_is_exact():
    rng = np.random.default_rng(9)
    n = helper.make_node
    model = onnx_model([n("Gemm", ["x", "w", "b"], ["h"], transB=1), n("Relu", ["h"], ["r"]),
                    n("Gemm", ["r", "w2"], ["y"], alpha=0.5)],
                   [("x", F, [None, 7])], [("y", F)], {"w": _rand(rng, 5, 7), "b": _rand(rng, 5), "w2": _rand(rng, 5, 3)})
    g = load(model)
    fused = passes.fuse_gemm(g)
    assert [nd.op_type for nd in fused.nodes] == ["FusedGemm", "Gemm"]   # alpha != 1 stays a Gemm
    feeds = {"x": _rand(rng, 4, 7)}
    assert passes.verify(g, fused, feeds)
    np.testing.assert_allclose(InferenceSession(fused).run(None, feeds)[0], _ort(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_gemm_fusion_turns_a_constant_bias_into_a_row_only():
    """A 1-D constant C becomes a (1, N) row under a new name; a C that the caller feeds stays as it is;
    the outputs stay bit for bit, at batch 1 too (where BLAS may take another routine)."""
    rng = np.random.default_rng(10)
    n = helper.make_node
    model = onnx_model([n("Gemm", ["x", "w", "b"], ["h"], transB=1), n("Relu", ["h"], ["r"]),
                    n("Gemm", ["r", "w2", "c"], ["y"])],
                   [("x", F, [None, 7]), ("c", F, [3])], [("y", F)],
                   {"w": _rand(rng, 5, 7), "b": _rand(rng, 5), "w2": _rand(rng, 5, 3)})
    g = load(model)
    fused = passes.fuse_gemm(g)
    first, second = fused.nodes
    assert fused.initializers[first.inputs[2]].shape == (1, 5) and "b" not in fused.initializers
    assert second.inputs[2] == "c" and "c" not in fused.initializers
    for batch in (1, 4):
        feeds = {"x": _rand(rng, batch, 7), "c": _rand(rng, 3)}
        assert passes.verify(g, fused, feeds)
        ours = InferenceSession(fused)
        for _ in range(3):   # the first run plans the buffers, the next ones use them
            np.testing.assert_array_equal(ours.run(None, feeds)[0], InferenceSession(g).run(None, feeds)[0])
        np.testing.assert_allclose(ours.run(None, feeds)[0], _ort(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_relu_zeros_are_shared_and_read_only():
    from course_lib.infer.ops.fused import zeros_like

    rng = np.random.default_rng(12)
    y = _rand(rng, 3, 5)
    z = zeros_like(y)
    assert z.shape == y.shape and z.dtype == y.dtype and not z.any() and not z.flags.writeable
    big = zeros_like(np.ones((100, 100), np.float64))
    assert big.shape == (100, 100) and big.dtype == np.float64 and not big.any()


# ---- buffers from the memory plan ---------------------------------------------------------------

def _aliasing_graph():
    """p = x @ W + b; v = Reshape(p) (a view of p's buffer); q = x2 @ W + b (p's size, made after
    p's last direct reader); y = v + Reshape(q). A plan that forgets that v looks into p's buffer
    hands that buffer to q, and y is wrong."""
    rng = np.random.default_rng(11)
    W, b = _rand(rng, 6, 6), _rand(rng, 6)
    shape = np.array([-1], np.int64)
    nodes = [Node("MatMulAdd", ["x", "W", "b"], ["p"], {}, "p", "course"),
             Node("Reshape", ["p", "flat"], ["v"], {}, "v"),
             Node("Neg", ["x"], ["x2"], {}, "x2"),
             Node("MatMulAdd", ["x2", "W", "b"], ["q"], {}, "q", "course"),
             Node("Reshape", ["q", "flat"], ["w"], {}, "w"),
             Node("Add", ["v", "w"], ["y"], {}, "y")]
    g = Graph(nodes, [Value("x", (4, 6), np.dtype("float32"))], [Value("y", None, np.dtype("float32"))],
              {"W": W, "b": b, "flat": shape}, {"": 17, "course": 1})
    return g, rng


def _runs(sess, feeds_list):
    return [sess.run(None, f)[0].copy() for f in feeds_list]


def test_planned_buffers_change_no_bit_and_never_hold_an_output():
    g, rng = _aliasing_graph()
    feeds = [{"x": _rand(rng, 4, 6)} for _ in range(3)]
    planned, plain = InferenceSession(g), InferenceSession(g, plan_buffers=False)
    first = planned.run(None, feeds[0])[0]
    kept = first.copy()
    for ours, ref in zip(_runs(planned, feeds), _runs(plain, feeds)):
        np.testing.assert_array_equal(ours, ref)
    assert planned.planned is not None and len(planned.planned[2]) >= 1   # the later runs used the plan
    np.testing.assert_array_equal(first, kept)                            # a returned output is never reused


def test_a_plan_that_ignores_views_is_caught(monkeypatch):
    """The lifetime rule matters: with views ignored, the test above's graph gives wrong numbers."""
    def last_read_only(order, views, keep):
        end = {name: len(order) for name in keep}
        for k, node in enumerate(order):
            for i in node.inputs:
                if i:
                    end[i] = max(end.get(i, k), k)
        return end

    monkeypatch.setattr(memory, "buffer_lives", last_read_only)
    g, rng = _aliasing_graph()
    feeds = [{"x": _rand(rng, 4, 6)} for _ in range(3)]
    ours, ref = _runs(InferenceSession(g), feeds), _runs(InferenceSession(g, plan_buffers=False), feeds)
    assert not np.array_equal(ours[-1], ref[-1])


def test_the_gpt_runs_from_planned_buffers(exported_gpt):
    onx, idx = exported_gpt
    sess = InferenceSession(onx, optimize=True, input_shapes={"idx": idx.shape})
    plain = InferenceSession(onx, optimize=True, input_shapes={"idx": idx.shape}, plan_buffers=False)
    rng = np.random.default_rng(4)
    for _ in range(3):
        feeds = {"idx": rng.integers(0, 65, idx.shape).astype(np.int64)}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], plain.run(None, feeds)[0])
    signature, steps, buffers = sess.planned
    planned = sum("out" in attrs for _, attrs in steps)
    assert planned > len(buffers) >= 1            # values whose lives do not overlap share buffers


@pytest.fixture(scope="module")
def exported_gpt():
    import torch

    from course_lib.infer.models import course_gpt, export

    gpt = course_gpt(vocab_size=65, block_size=16, n_layer=2, n_head=2, n_embd=32)
    onx = export(gpt, torch.zeros(2, 16, dtype=torch.long), ["idx"], ["logits"], {"idx": {0: "batch", 1: "time"}})
    return onx, np.zeros((3, 16), np.int64)


def test_only_kernels_that_reshape_the_buffer_get_one():
    """A ufunc registered as it is (Not, Relu's np.maximum...) takes `out` too, but of the result's shape:
    handing it a flat planned buffer breaks it, so only a keyword-only `out` counts."""
    from course_lib.infer.ops.fused import matmul_add
    from course_lib.infer.session import _takes_out_buffer

    assert _takes_out_buffer(matmul_add) and _takes_out_buffer(conv_ops.fused_conv)
    assert not _takes_out_buffer(np.logical_not) and not _takes_out_buffer(np.add)
