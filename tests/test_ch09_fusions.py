"""Chapter 09's bigger fusions (elementwise regions, masked softmax), the arena, against onnxruntime."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx_models import onnx_model

from course_lib.infer import InferenceSession, load, passes
from course_lib.infer.arena import keep_freed_memory
from course_lib.infer.fusions import fuse_elementwise, fuse_masked_softmax
from course_lib.infer.ops import fused

F = TensorProto.FLOAT


def _against_onnxruntime(model, feeds, fusion, expect_ops):
    """The fusion leaves the op types `expect_ops`, and the result matches onnxruntime and the unfused engine."""
    g = load(model)
    fused_g = fusion(g)
    assert sorted(n.op_type for n in fused_g.nodes) == sorted(expect_ops)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    ours = InferenceSession(fused_g).run(None, feeds)
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert passes.verify(g, fused_g, feeds)  # identical to the unfused engine, bit for bit


def _c(v):
    return np.array(v, np.float32)


def _gelu_tanh(extra_output=None, vector_const=False):
    """GPT-2's GELU as torch exports it: 0.5 * (x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))))."""
    n = helper.make_node
    nodes = [n("Mul", ["x", "x"], ["xx"]), n("Mul", ["x", "xx"], ["x3"]), n("Mul", ["k3", "x3"], ["a"]),
             n("Add", ["x", "a"], ["b"]), n("Mul", ["k", "b"], ["d"]), n("Tanh", ["d"], ["t"]),
             n("Add", ["one", "t"], ["e"]), n("Mul", ["x", "e"], ["f"]), n("Mul", ["half", "f"], ["y"])]
    consts = {"k3": _c(0.044715), "k": _c(np.sqrt(2 / np.pi)), "one": _c(1.0), "half": _c(0.5)}
    if vector_const:
        consts["k3"] = np.full(7, 0.044715, np.float32)
    outputs = [("y", F)] + ([(extra_output, F)] if extra_output else [])
    return onnx_model(nodes, [("x", F, [3, 5, 7])], outputs, consts)


X = {"x": np.random.default_rng(0).standard_normal((3, 5, 7)).astype(np.float32) * 3}


def test_gelu_tanh_becomes_one_node():
    _against_onnxruntime(_gelu_tanh(), X, fuse_elementwise, ["Elementwise"])


def test_gelu_erf_becomes_one_node():
    n = helper.make_node
    model = onnx_model([n("Div", ["x", "r2"], ["s"]), n("Erf", ["s"], ["e"]), n("Add", ["e", "one"], ["p"]),
                    n("Mul", ["x", "p"], ["q"]), n("Mul", ["q", "half"], ["y"])],
                   [("x", F, [3, 5, 7])], [("y", F)], {"r2": _c(np.sqrt(2)), "one": _c(1.0), "half": _c(0.5)})
    _against_onnxruntime(model, X, fuse_elementwise, ["Elementwise"])


def test_a_value_read_outside_stays_outside():
    # "t" (tanh's output) is also a graph output: the region is cut back to end at Tanh, and the
    # three ops after it (which read x as well as t) stay as they are
    _against_onnxruntime(_gelu_tanh(extra_output="t"), X, fuse_elementwise,
                         ["Elementwise", "Add", "Mul", "Mul"])


def test_vector_constants_are_left_alone():
    # a (7,) constant would be cut into blocks wrongly: the ops around it stay as they were
    model = _gelu_tanh(vector_const=True)
    g = fuse_elementwise(load(model))
    assert "Mul" in [n.op_type for n in g.nodes]
    assert all("k3" not in n.inputs for n in g.nodes if n.op_type == "Elementwise")
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, X)[0]
    np.testing.assert_allclose(InferenceSession(g).run(None, X)[0], ref, rtol=1e-5, atol=1e-5)


def test_two_tensor_inputs_are_not_a_region():
    n = helper.make_node
    model = onnx_model([n("Mul", ["x", "z"], ["p"]), n("Tanh", ["p"], ["y"])],
                   [("x", F, [3, 5, 7]), ("z", F, [3, 5, 7])], [("y", F)], {})
    assert [nd.op_type for nd in fuse_elementwise(load(model)).nodes] == ["Mul", "Tanh"]


def test_elementwise_blocks_and_dtypes(monkeypatch):
    """Several blocks, a ragged last block, an empty input, integers and a broadcast to a higher rank."""
    monkeypatch.setattr(fused, "BLOCK", 64)
    rng = np.random.default_rng(1)
    for x in (rng.standard_normal((5, 37)).astype(np.float32), np.zeros((0, 3), np.float32)):
        y = fused.elementwise(x, _c(2.0), ops=["Mul", "Tanh", "Add"], args=[0, 1, 2, -1, 3, 0])
        np.testing.assert_array_equal(y, np.tanh(x * _c(2.0)) + x)
    xi = rng.integers(-50, 50, (4, 9)).astype(np.int64)
    three = np.array([[[3]]], np.int64)
    y = fused.elementwise(xi, three, ops=["Div", "Mul"], args=[0, 1, 2, 0])
    assert y.shape == (1, 4, 9) and y.dtype == np.int64
    np.testing.assert_array_equal(y, (np.trunc(xi / 3).astype(np.int64) * xi)[None])


def _attention(opset=17, scale_op="Div", mask_is_input=False, where_is_output=False):
    """scores = q @ k; Softmax(Where(causal mask, -inf, scores / sqrt(d))) along the last axis."""
    n = helper.make_node
    scale_in = ["s", "c"] if scale_op == "Div" else ["c", "s"]
    nodes = [n("MatMul", ["q", "k"], ["s"]), n(scale_op, scale_in, ["s2"]),
             n("Where", ["mask", "fill", "s2"], ["m"]), n("Softmax", ["m"], ["y"], axis=-1)]
    inputs = [("q", F, [2, 3, 6, 4]), ("k", F, [2, 3, 4, 6])]
    mask = ~np.tril(np.ones((6, 6), bool))
    consts = {"c": _c(2.0 if scale_op == "Div" else 0.5), "fill": _c(-np.inf)}
    if mask_is_input:
        inputs.append(("mask", TensorProto.BOOL, [6, 6]))
    else:
        consts["mask"] = mask
    outputs = [("y", F)] + ([("m", F)] if where_is_output else [])
    rng = np.random.default_rng(2)
    feeds = {"q": rng.standard_normal((2, 3, 6, 4)).astype(np.float32),
             "k": rng.standard_normal((2, 3, 4, 6)).astype(np.float32)}
    if mask_is_input:
        feeds["mask"] = mask
    return onnx_model(nodes, inputs, outputs, consts, opset), feeds


@pytest.mark.parametrize("scale_op", ["Div", "Mul"])
def test_masked_softmax_becomes_one_node(scale_op):
    model, feeds = _attention(scale_op=scale_op)
    _against_onnxruntime(model, feeds, fuse_masked_softmax, ["MatMul", "MaskedSoftmax"])


@pytest.mark.parametrize("variant", [{"mask_is_input": True}, {"where_is_output": True}, {"opset": 12}])
def test_masked_softmax_near_misses_are_left_alone(variant):
    model, feeds = _attention(**variant)
    _against_onnxruntime(model, feeds, fuse_masked_softmax, ["MatMul", "Div", "Where", "Softmax"])


def test_masked_softmax_without_a_scale_and_with_a_promoting_fill():
    s = np.random.default_rng(3).standard_normal((2, 5, 5)).astype(np.float32)
    mask = np.triu(np.ones((5, 5), bool), 1)
    want = np.where(mask, np.float32(-1e9), s)
    want = np.exp(want - want.max(-1, keepdims=True))
    np.testing.assert_allclose(fused.masked_softmax(s, mask, _c(-1e9)), want / want.sum(-1, keepdims=True),
                               rtol=1e-6)
    y = fused.masked_softmax(s, mask, np.array(-1e9), _c(2.0))  # a float64 fill promotes, as Where does
    assert y.dtype == np.float64 and np.allclose(y.sum(-1), 1)


def test_optimize_fuses_the_gpt_s_gelu_and_attention():
    import torch

    from course_lib.infer.models import course_gpt, export
    onx = export(course_gpt(n_layer=1, n_embd=32, block_size=16), torch.zeros(2, 16, dtype=torch.long), ["idx"],
                 ["logits"], {"idx": {0: "batch", 1: "time"}})
    feeds = {"idx": np.random.default_rng(4).integers(0, 65, (3, 16)).astype(np.int64)}
    fast = InferenceSession(onx, optimize=True, input_shapes={"idx": (3, 16)})
    ops = [n.op_type for n in fast.graph.nodes]
    assert ops.count("Elementwise") == 1 and ops.count("MaskedSoftmax") == 1
    assert not {"Tanh", "Where", "Softmax", "Div"} & set(ops)
    ref = ort.InferenceSession(onx, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(fast.run(None, feeds)[0], ref, rtol=1e-5, atol=1e-5)


def test_fused_graph_round_trips_through_onnx():
    g = fuse_elementwise(load(_gelu_tanh()))
    again = load(passes.to_onnx(g))
    assert passes.verify(g, again, X)


def test_arena_is_harmless():
    assert keep_freed_memory() in (True, False)
    model = _gelu_tanh()
    a = InferenceSession(model, arena=False).run(None, X)[0]
    assert np.array_equal(a, InferenceSession(model).run(None, X)[0])
