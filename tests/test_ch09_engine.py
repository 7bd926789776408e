"""The chapter 09 engine: loading, validation, the API, kernels against onnxruntime, passes, memory, profiler."""

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from course_lib.infer import (
    Graph,
    InferenceSession,
    InvalidGraph,
    InvalidInput,
    Node,
    UnknownOp,
    Value,
    load,
    passes,
    to_onnx,
    topological_order,
)
from course_lib.infer.memory import memory_plan
from course_lib.infer.models import MLP, course_cnn, course_gpt, course_mamba, export, train_digits
from course_lib.infer.profile import format_table, profile

F = TensorProto.FLOAT


def _ort(model, feeds):
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)


def _tiny():
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="relu")],
        "tiny", [helper.make_tensor_value_info("x", F, ["batch", 3])], [helper.make_tensor_value_info("y", F, None)],
        [onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32), "W")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


# ---- loading and the API ---------------------------------------------------------------

def test_load_from_path_bytes_and_proto(tmp_path):
    model = _tiny()
    path = tmp_path / "tiny.onnx"
    onnx.save(model, path)
    x = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    ref = _ort(model, {"x": x})[0]
    for source in (model, model.SerializeToString(), str(path), path):
        np.testing.assert_allclose(InferenceSession(source).run(None, {"x": x})[0], ref, rtol=1e-6)


def test_api_like_onnxruntime():
    sess = InferenceSession(_tiny())
    (i,), (o,) = sess.get_inputs(), sess.get_outputs()
    ref = ort.InferenceSession(_tiny().SerializeToString(), providers=["CPUExecutionProvider"])
    assert (i.name, i.shape, i.type) == (ref.get_inputs()[0].name, ref.get_inputs()[0].shape, ref.get_inputs()[0].type)
    assert o.name == "y"
    x = np.ones((2, 3), np.float32) * 0.5
    assert len(sess.run(["y"], {"x": x})) == 1


def test_load_round_trip():
    g = load(_tiny())
    assert [n.op_type for n in g.nodes] == ["MatMul", "Relu"] and g.opset == 17 and "W" in g.initializers
    assert [n.op_type for n in load(to_onnx(g)).nodes] == ["MatMul", "Relu"]


# ---- validation ------------------------------------------------------------------------

def test_unknown_op_names_op_node_and_opset():
    m = _tiny()
    m.graph.node[1].op_type = "Frobnicate"
    with pytest.raises(UnknownOp, match=r"Frobnicate.*relu.*opset 17"):
        InferenceSession(m)


def test_malformed_graph():
    m = _tiny()
    m.graph.node[1].input[0] = "nowhere"
    with pytest.raises(InvalidGraph, match="nowhere"):
        InferenceSession(m)
    m = _tiny()
    m.graph.node[1].output[0] = "h"
    with pytest.raises(InvalidGraph, match="written twice"):
        InferenceSession(m)


def test_cycle_is_reported():
    g = Graph([Node("Relu", ["b"], ["a"]), Node("Relu", ["a"], ["b"])], [], [Value("a", None, np.dtype("float32"))], {})
    with pytest.raises(InvalidGraph, match="cycle"):
        topological_order(g)


def test_bad_feeds():
    sess = InferenceSession(_tiny())
    with pytest.raises(InvalidInput, match="missing inputs: \\['x'\\]"):
        sess.run(None, {})
    with pytest.raises(InvalidInput, match="dtype float64"):
        sess.run(None, {"x": np.zeros((2, 3))})
    with pytest.raises(InvalidInput, match=r"shape \(2, 4\)"):
        sess.run(None, {"x": np.zeros((2, 4), np.float32)})
    with pytest.raises(InvalidInput, match="unknown inputs"):
        sess.run(None, {"x": np.zeros((2, 3), np.float32), "z": np.zeros(1)})


def test_bad_feeds_after_good_ones():
    """The session checks a feed fully only when its shapes and dtypes differ from the last good one's:
    a bad feed after good runs must still be refused, whatever it gets wrong."""
    sess = InferenceSession(_tiny())
    rng = np.random.default_rng(3)
    good = rng.standard_normal((2, 3)).astype(np.float32)
    first = sess.run(None, {"x": good})[0].copy()
    sess.run(None, {"x": good})
    bad = [({}, "missing inputs"), ({"x": good.astype(np.float64)}, "dtype float64"),
           ({"x": good[:, :2].copy()}, r"shape \(2, 2\)"), ({"x": good, "z": good}, "unknown inputs"),
           ({"x": good.tolist()}, "must be a numpy array"), ({"z": good}, "missing inputs")]
    for feeds, message in bad:
        with pytest.raises(InvalidInput, match=message):
            sess.run(None, feeds)
    np.testing.assert_array_equal(sess.run(None, {"x": good})[0], first)


def test_schedule_ignores_file_order():
    g = load(_tiny())
    g.nodes.reverse()
    assert [n.op_type for n in topological_order(g)] == ["MatMul", "Relu"]


# ---- kernels against onnxruntime (random single-node models) ----------------------------

def _run_node_both(op, inputs, attrs, opset=17):
    vi = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in inputs.items()]
    g = helper.make_graph([helper.make_node(op, list(inputs), ["y"], **attrs)], "t", vi,
                          [helper.make_tensor_value_info("y", F, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return InferenceSession(m).run(None, inputs)[0], _ort(m, inputs)[0]


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 3), st.integers(3, 9), st.integers(1, 3), st.integers(0, 2), st.integers(1, 2),
       st.integers(1, 2), st.sampled_from([1, 2]))
def test_conv_matches_onnxruntime(n, size, k, pad, stride, dilation, group):
    rng = np.random.default_rng(size * 7 + k)
    x = rng.standard_normal((n, 2 * group, size, size + 2)).astype(np.float32)
    w = rng.standard_normal((3 * group, 2, k, k)).astype(np.float32)
    b = rng.standard_normal(3 * group).astype(np.float32)
    attrs = dict(pads=[pad, pad, pad, pad], strides=[stride, stride], dilations=[dilation, dilation], group=group)
    if (size + 2 * pad - (k - 1) * dilation - 1) < 0:
        return
    ours, ref = _run_node_both("Conv", {"x": x, "w": w, "b": b}, attrs)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


@settings(max_examples=10, deadline=None)
@given(st.integers(4, 9), st.integers(2, 3), st.integers(1, 2), st.integers(0, 1), st.booleans(), st.booleans())
def test_pools_match_onnxruntime(size, k, stride, pad, ceil, include_pad):
    x = np.random.default_rng(size).standard_normal((2, 3, size, size + 1)).astype(np.float32)
    common = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, ceil_mode=int(ceil))
    ours, ref = _run_node_both("MaxPool", {"x": x}, common)
    np.testing.assert_allclose(ours, ref, rtol=1e-6)
    ours, ref = _run_node_both("AveragePool", {"x": x}, dict(common, count_include_pad=int(include_pad)))
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op,attrs", [("Softmax", {"axis": 1}), ("LogSoftmax", {"axis": -1}), ("Erf", {}),
                                      ("Sigmoid", {}), ("Tanh", {}), ("ReduceMean", {"keepdims": 0})])
def test_float_ops_match_onnxruntime(op, attrs):
    x = np.random.default_rng(3).uniform(-4, 4, size=(3, 5, 7)).astype(np.float32)
    ours, ref = _run_node_both(op, {"x": x}, attrs)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


# ---- the course's models against onnxruntime, with and without passes -------------------

@pytest.fixture(scope="module")
def exported():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    mlp, cnn = MLP(), course_cnn()
    assert train_digits(mlp) > 0.8 and train_digits(cnn) > 0.8     # a few epochs on the digits: trained weights
    gpt = course_gpt(n_layer=2, n_embd=32, block_size=16)
    return [
        (export(mlp, torch.randn(2, 64), ["x"], ["y"], {"x": {0: "batch"}}),
         [{"x": rng.standard_normal((b, 64)).astype(np.float32)} for b in (1, 5)]),
        (export(cnn, torch.randn(2, 1, 8, 8), ["x"], ["y"], {"x": {0: "batch"}}),
         [{"x": rng.standard_normal((b, 1, 8, 8)).astype(np.float32)} for b in (1, 3)]),
        (export(gpt, torch.zeros(2, 16, dtype=torch.long), ["idx"], ["logits"], {"idx": {0: "batch", 1: "time"}}),
         [{"idx": rng.integers(0, 65, (b, t)).astype(np.int64)} for b, t in ((1, 16), (3, 11))]),
    ]


def test_the_models_are_the_course_s():
    from course_lib.custom_ops.cnn import DigitsCNN
    from course_lib.gpt.model import GPT
    from course_lib.mamba import Mamba
    assert isinstance(course_gpt(n_layer=1, n_embd=16, block_size=8).model, GPT)
    assert isinstance(course_mamba(d_model=16, n_layer=1).model, Mamba)
    custom = DigitsCNN(custom=True)
    twin = course_cnn(from_custom=custom)
    assert isinstance(twin, DigitsCNN) and torch.equal(twin.conv2[0].weight, custom.conv2.weight)
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(twin(x), custom(x), rtol=1e-4, atol=1e-5)


def test_custom_op_cnn_does_not_export():
    """Chapter 08's custom ops are autograd.Functions around numba kernels: the tracer cannot see inside."""
    from course_lib.custom_ops.cnn import DigitsCNN
    # the functions become opaque PythonOp nodes, on which torch's TorchScript exporter fails in a graph pass
    with pytest.raises(IndexError, match="Argument passed to at\\(\\) was not in the map"):
        export(DigitsCNN(custom=True), torch.randn(2, 1, 8, 8), ["x"], ["y"])


def test_mamba_matches_onnxruntime_up_to_its_export_length():
    """The parallel scan's loop unrolls into ceil(log2 T) rounds at export: right for T <= 16 here, not beyond."""
    mamba = course_mamba()
    onx = export(mamba, torch.zeros(1, 16, dtype=torch.long), ["idx"], ["logits"], {"idx": {0: "batch", 1: "time"}})
    rng = np.random.default_rng(0)
    sess = InferenceSession(onx)
    for b, t in ((2, 16), (1, 11)):
        feeds = {"idx": rng.integers(0, 65, (b, t)).astype(np.int64)}
        ours = sess.run(None, feeds)[0]
        np.testing.assert_allclose(ours, _ort(onx, feeds)[0], rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            np.testing.assert_allclose(ours, mamba(torch.as_tensor(feeds["idx"])).numpy(), rtol=1e-4, atol=1e-4)
    long = rng.integers(0, 65, (1, 40)).astype(np.int64)
    with torch.no_grad():
        assert np.abs(sess.run(None, {"idx": long})[0] - mamba(torch.as_tensor(long)).numpy()).max() > 1e-4


def test_chunked_mamba_scan_does_not_export():
    from course_lib.infer.models import LogitsOnly
    from course_lib.mamba import Mamba, MambaConfig
    m = LogitsOnly(Mamba(MambaConfig(vocab_size=65, d_model=16, n_layer=1, scan="chunked")))
    with pytest.raises(torch.onnx.errors.UnsupportedOperatorError, match="'aten::cumprod' to ONNX opset version 17"):
        export(m, torch.zeros(1, 16, dtype=torch.long), ["idx"], ["logits"])


def test_models_match_onnxruntime(exported):
    for onx, feeds_list in exported:
        plain = InferenceSession(onx)
        for feeds in feeds_list:
            ref = _ort(onx, feeds)[0]
            np.testing.assert_allclose(plain.run(None, feeds)[0], ref, rtol=1e-5, atol=1e-5)
            fast = InferenceSession(onx, optimize=True, input_shapes={k: v.shape for k, v in feeds.items()})
            assert np.array_equal(fast.run(None, feeds)[0], plain.run(None, feeds)[0])
            assert len(fast.graph.nodes) <= len(plain.graph.nodes)


def test_each_pass_keeps_outputs_identical(exported):
    for onx, feeds_list in exported:
        g = load(onx)
        feeds = feeds_list[0]
        shapes = {k: v.shape for k, v in feeds.items()}
        for p in (passes.fold_constants, passes.eliminate_dead_nodes, passes.fuse_matmul_add, passes.fuse_conv,
                  lambda g: passes.fold_shapes(g, shapes)):
            assert passes.verify(g, p(g), feeds)


def test_passes_shrink_the_gpt(exported):
    onx, feeds_list = exported[2]
    g = load(onx)
    shapes = {"idx": feeds_list[0]["idx"].shape}
    folded = passes.fold_shapes(g, shapes)
    assert not any(n.op_type == "Shape" for n in folded.nodes)
    fused = passes.fuse_matmul_add(folded)
    assert any(n.op_type == "MatMulAdd" for n in fused.nodes)
    assert len(fused.nodes) < len(folded.nodes) < len(g.nodes)


def test_conv_fusion_takes_bias_relu_and_pool(exported):
    g = load(exported[1][0])
    fused = passes.fuse_conv(g)
    assert [n.op_type for n in fused.nodes] == ["FusedConv", "FusedConv", "Flatten", "Gemm"]
    assert all(n.attrs["activation"] == "Relu" and n.attrs["pool_kernel_shape"] == [2, 2]
               for n in fused.nodes[:2])


def test_matmul_add_keeps_shared_products():
    W, b = np.ones((3, 3), np.float32) * 0.5, np.arange(3, dtype=np.float32)
    g = Graph([Node("MatMul", ["x", "W"], ["p"]), Node("Add", ["p", "b"], ["y"]), Node("Neg", ["p"], ["z"])],
              [Value("x", (2, 3), np.dtype("float32"))],
              [Value("y", None, np.dtype("float32")), Value("z", None, np.dtype("float32"))], {"W": W, "b": b})
    assert [n.op_type for n in passes.fuse_matmul_add(g).nodes] == ["MatMul", "Add", "Neg"]


def test_fold_constants_leaves_input_dependent_nodes():
    g = Graph([Node("Neg", ["c"], ["nc"]), Node("Add", ["x", "nc"], ["y"])], [Value("x", (2,), np.dtype("float32"))],
              [Value("y", None, np.dtype("float32"))], {"c": np.array([1.5, -2.5], np.float32)})
    folded = passes.fold_constants(g)
    assert [n.op_type for n in folded.nodes] == ["Add"] and "nc" in folded.initializers


def test_dead_nodes_go():
    g = Graph([Node("Neg", ["x"], ["unused"]), Node("Relu", ["x"], ["y"])], [Value("x", (2,), np.dtype("float32"))],
              [Value("y", None, np.dtype("float32"))], {})
    assert [n.op_type for n in passes.eliminate_dead_nodes(g).nodes] == ["Relu"]


# ---- memory and profiling --------------------------------------------------------------

def test_memory_plan_beats_naive(exported):
    onx, feeds_list = exported[2]
    plan = memory_plan(InferenceSession(onx), feeds_list[1])
    assert 0 < plan.peak_bytes < plan.naive_bytes / 3
    assert len(plan.live_bytes) == len(InferenceSession(onx).order)


def test_profiler(exported):
    onx, feeds_list = exported[0]
    rows, wall = profile(InferenceSession(onx), feeds_list[0], repeats=2)
    assert {r[0] for r in rows} >= {"Gemm", "Relu"} and wall > 0
    assert abs(sum(r[3] for r in rows) - 1) < 1e-9 and "Gemm" in format_table(rows)


def test_export_bytes_round_trip():
    buf = export(MLP(), torch.randn(1, 64), ["x"], ["y"])
    assert onnx.load_from_string(buf).graph.input[0].name == "x"
    assert isinstance(io.BytesIO(buf).getvalue(), bytes)


def test_feeds_of_an_ndarray_subclass_are_never_planned_with_stale_shapes():
    """A feed that is an ndarray subclass has no cached signature: each run checks it and runs unplanned,
    so a run with other shapes never reuses buffers sized for the last ones."""
    from course_lib.infer.models import MLP, export

    torch.manual_seed(0)
    onx = export(MLP(), torch.randn(2, 64), ["x"], ["y"], {"x": {0: "batch"}})
    sess = InferenceSession(onx, optimize=True)
    rng = np.random.default_rng(4)
    for batch in (3, 5, 3, 7):
        x = rng.standard_normal((batch, 64)).astype(np.float32)
        ours = sess.run(None, {"x": x.view(_Sub)})[0]
        np.testing.assert_allclose(ours, _ort(onx, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert sess.planned is None   # a plan keyed by no signature would serve any shapes


class _Sub(np.ndarray):
    pass
