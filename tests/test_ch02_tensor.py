"""course_lib.tensor beyond single ops: strides and views, errors, autograd rules,
modules and optimizers against torch.nn / torch.optim, the DataLoader, backend selection."""

import numpy as np
import pytest
import torch

import course_lib.tensor as ct
from course_lib.tensor import nn, optim
from course_lib.tensor.broadcast import broadcast_index, shape_broadcast
from course_lib.tensor.tensor_data import ShapeError, TensorData, index_to_position, slice_view, to_index

# ------------------------------------------------------------------ storage and strides

def test_index_math_round_trips():
    td = TensorData.from_numpy(np.arange(60.0).reshape(3, 4, 5))
    assert td.strides == (20, 5, 1)
    idx = np.zeros(3, dtype=np.int64)
    for ordinal in range(60):
        to_index(ordinal, td.shape, idx)
        assert index_to_position(idx, td.strides) == ordinal


def test_views_share_storage_and_match_numpy():
    a = np.random.default_rng(0).standard_normal((3, 4, 5))
    td = TensorData.from_numpy(a, np.float64)
    p = td.permute(2, 0, 1)
    assert p.storage is td.storage and not p.is_contiguous()
    np.testing.assert_array_equal(p.to_numpy(), a.transpose(2, 0, 1))
    e = TensorData.from_numpy(a[:, :1, :], np.float64).expand((2, 3, 4, 5))
    assert e.strides[0] == 0 and e.strides[2] == 0
    np.testing.assert_array_equal(e.to_numpy(), np.broadcast_to(a[:, :1, :], (2, 3, 4, 5)))
    s = slice_view(td, (1, slice(1, 4, 2), None, Ellipsis))
    np.testing.assert_array_equal(s.to_numpy(), a[1, 1:4:2, None, ...])
    assert s.storage is td.storage and s.offset == 20 + 5


def test_broadcast_helpers():
    assert shape_broadcast((3, 1, 5), (4, 1)) == (3, 4, 5)
    out = np.zeros(2, dtype=np.int64)
    broadcast_index([2, 3, 4], (3, 4, 5), (4, 1), out)
    assert out.tolist() == [3, 0]
    with pytest.raises(ShapeError, match=r"mul: shapes \(3, 4\) and \(5,\)"):
        shape_broadcast((3, 4), (5,), "mul")


def test_tensor_views_do_not_copy():
    x = ct.randn(4, 6)
    assert x.T.data.storage is x.data.storage
    assert x.reshape(2, 12).data.storage is x.data.storage
    assert x[1:3].data.storage is x.data.storage


# ------------------------------------------------------------------ errors name the op and shapes

def test_clear_errors():
    with pytest.raises(ShapeError, match=r"matmul: shapes \(3, 4\) and \(5, 2\)"):
        ct.randn(3, 4) @ ct.randn(5, 2)
    with pytest.raises(ShapeError, match=r"add: shapes \(3, 4\) and \(2, 4\) do not broadcast"):
        ct.randn(3, 4) + ct.randn(2, 4)
    with pytest.raises(ShapeError, match=r"matmul \(batch dims\)"):
        ct.randn(2, 3, 4) @ ct.randn(3, 4, 5)
    with pytest.raises(RuntimeError, match=r"scalar output.*shape \(3, 4\)"):
        (ct.randn(3, 4, requires_grad=True) * 2).backward()
    with pytest.raises(ShapeError, match=r"reshape: cannot reshape \(3, 4\)"):
        ct.randn(3, 4).reshape(5, 2)
    with pytest.raises(ShapeError, match=r"Linear\(4, 2\): input has shape \(3, 5\)"):
        nn.Linear(4, 2)(ct.randn(3, 5))
    with pytest.raises(IndexError, match="out of range"):
        ct.randn(3)[5]


BAD_DIMS = [  # (name, call on a tensor of shape (3, 4, 5)); each must fail in PyTorch too
    ("sum dim 3", lambda t: t.sum(3)), ("sum dim -4", lambda t: t.sum(-4)), ("max dim 7", lambda t: t.max(7)),
    ("softmax dim 3", lambda t: t.softmax(3)), ("log_softmax dim -4", lambda t: t.log_softmax(-4)),
    ("transpose 0, 3", lambda t: t.transpose(0, 3)), ("permute repeats", lambda t: t.permute(0, 0, 1)),
    ("permute out of range", lambda t: t.permute(0, 1, 3)), ("unsqueeze 4", lambda t: t.unsqueeze(4)),
    ("squeeze 3", lambda t: t.squeeze(3)), ("flatten 3", lambda t: t.flatten(3)),
    ("view of a transpose", lambda t: t.transpose(0, 1).view(-1)),
]


@pytest.mark.parametrize("name, call", BAD_DIMS, ids=[n for n, _ in BAD_DIMS])
def test_bad_dims_raise_where_torch_raises(name, call):
    data = np.random.default_rng(2).standard_normal((3, 4, 5))
    with pytest.raises((RuntimeError, IndexError)):
        call(torch.tensor(data))  # the oracle refuses it too
    with pytest.raises((IndexError, ShapeError)) as err:
        call(ct.tensor(data))
    assert "(3, 4, 5)" in str(err.value) or "(4, 3, 5)" in str(err.value), str(err.value)  # names the shape


def test_good_negative_dims_match_torch():
    data = np.random.default_rng(3).standard_normal((3, 4, 5))
    t, o = torch.tensor(data), ct.tensor(data, dtype=np.float64)
    for ours, theirs in [(o.softmax(-3), t.softmax(-3)), (o.transpose(-1, 0), t.transpose(-1, 0)),
                         (o.unsqueeze(-1), t.unsqueeze(-1)), (o.unsqueeze(-4), t.unsqueeze(-4)),
                         (o.flatten(-2), t.flatten(-2)), (o.permute(-1, 0, -2), t.permute(-1, 0, -2)),
                         (o.contiguous().view(5, -1), t.contiguous().view(5, -1))]:
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-12)
    assert o.transpose(0, 1).reshape(-1).shape == (60,)  # reshape copies where view refuses


def test_cross_entropy_rejects_bad_targets():
    logits = ct.randn(4, 3)
    with pytest.raises(IndexError, match=r"target\[2\] = 3 is not a class index.*0 to 2"):
        ct.cross_entropy(logits, [0, 1, 3, 2])
    with pytest.raises(IndexError, match=r"target\[1\] = -1"):
        ct.cross_entropy(logits, [0, -1, 1, 2])   # numpy would silently wrap -1 to the last class
    with pytest.raises(TypeError, match="class indices"):
        ct.cross_entropy(logits, np.array([0.0, 1.0, 2.0, 1.0]))
    with pytest.raises(IndexError):  # the oracle agrees
        torch.nn.functional.cross_entropy(torch.randn(4, 3), torch.tensor([0, 1, 3, 2]))


def test_in_place_change_of_a_saved_tensor_is_caught():
    w = ct.randn(3, requires_grad=True)
    x = ct.randn(3)
    y = (w * x).sum()
    x.add_(1.0)
    with pytest.raises(RuntimeError, match=r"Mul.backward: saved tensor 1.*changed in place"):
        y.backward()


# ------------------------------------------------------------------ autograd rules

def test_no_grad_and_detach():
    w = ct.randn(3, requires_grad=True)
    with ct.no_grad():
        y = w * 2
    assert not y.requires_grad
    assert not w.detach().requires_grad and ct.is_grad_enabled()


def test_gradients_accumulate_and_retain_grad():
    w = ct.Tensor(np.array([1.0, -2.0, 3.0]), requires_grad=True)
    h = (w * w).retain_grad()
    h.sum().backward()
    (w * 3.0).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * w.numpy() + 3)
    np.testing.assert_allclose(h.grad.numpy(), np.ones(3))


def test_deep_graph_needs_no_recursion():
    x = ct.Tensor(np.array([0.5]), requires_grad=True)
    y = x
    for _ in range(3000):  # deeper than Python's recursion limit
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0001 ** 3000], rtol=1e-9)


def test_float32_by_default_float64_kept():
    assert ct.Tensor([1.0, 2.0]).dtype == np.float32
    assert ct.Tensor(np.zeros(2)).dtype == np.float64
    assert (ct.Tensor([1.0]) * 2.0).dtype == np.float32


# ------------------------------------------------------------------ modules

def _torch_linear(lin):
    t = torch.nn.Linear(lin.in_features, lin.out_features).double()
    with torch.no_grad():
        t.weight.copy_(torch.tensor(lin.weight.numpy()))
        t.bias.copy_(torch.tensor(lin.bias.numpy()))
    return t


def test_linear_layernorm_gelu_against_torch():
    rng = np.random.default_rng(1)
    ct.manual_seed(1)
    lin = nn.Linear(5, 7, dtype=np.float64)
    ln = nn.LayerNorm(7, dtype=np.float64)
    ln.weight.copy_(ct.Tensor(rng.standard_normal(7)))
    ln.bias.copy_(ct.Tensor(rng.standard_normal(7)))
    x = rng.standard_normal((3, 4, 5))
    model = nn.Sequential(lin, nn.GELU(), ln)
    tln = torch.nn.LayerNorm(7).double()
    with torch.no_grad():
        tln.weight.copy_(torch.tensor(ln.weight.numpy()))
        tln.bias.copy_(torch.tensor(ln.bias.numpy()))
    tmodel = torch.nn.Sequential(_torch_linear(lin), torch.nn.GELU(), tln)
    g = rng.standard_normal((3, 4, 7))
    out = model(ct.Tensor(x))
    (out * ct.Tensor(g)).sum().backward()
    tout = tmodel(torch.tensor(x))
    (tout * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), atol=1e-10)
    for (name, p), tp in zip(model.named_parameters(), tmodel.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), atol=1e-10, err_msg=name)


def test_embedding_gradients_add_up_for_repeated_rows():
    ct.manual_seed(0)
    emb = nn.Embedding(6, 3, dtype=np.float64)
    idx = np.array([[1, 4, 1], [0, 1, 5]])
    temb = torch.nn.Embedding(6, 3).double()
    with torch.no_grad():
        temb.weight.copy_(torch.tensor(emb.weight.numpy()))
    g = np.random.default_rng(2).standard_normal((2, 3, 3))
    (emb(idx) * ct.Tensor(g)).sum().backward()
    (temb(torch.tensor(idx)) * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(emb.weight.grad.numpy(), temb.weight.grad.numpy(), atol=1e-12)


def test_dropout_train_and_eval():
    ct.manual_seed(0)
    drop = nn.Dropout(0.25)
    x = ct.ones(2000)
    y = drop(x).numpy()
    assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.75)}
    assert 0.2 < (y == 0).mean() < 0.3
    drop.eval()
    assert drop(x) is x


def test_module_bookkeeping():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    names = [n for n, _ in model.named_parameters()]
    assert names == ["layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias"]
    model.eval()
    assert not any(m.training for m in model.modules())
    state = model.state_dict()
    other = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    other.load_state_dict(state)
    x = ct.randn(5, 3)
    np.testing.assert_array_equal(model(x).numpy(), other(x).numpy())
    with pytest.raises(KeyError, match="missing"):
        other.load_state_dict({"layers.0.weight": state["layers.0.weight"]})
    assert "Linear(3, 4" in repr(model)


# ------------------------------------------------------------------ optimizers

@pytest.mark.parametrize("name, ours, theirs", [
    ("sgd", lambda p: optim.SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    ("momentum+wd", lambda p: optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01),
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01)),
    ("adam", lambda p: optim.Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    ("adam+wd", lambda p: optim.Adam(p, lr=0.01, weight_decay=0.1),
     lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1)),
    ("adamw", lambda p: optim.AdamW(p, lr=0.01, weight_decay=0.1),
     lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)),
])
def test_optimizers_match_torch(name, ours, theirs):
    rng = np.random.default_rng(3)
    w0, x, y = rng.standard_normal((4, 3)), rng.standard_normal((7, 3)), rng.standard_normal((7, 4))
    w, tw = nn.Parameter(w0.copy()), torch.tensor(w0.copy(), requires_grad=True)
    opt, topt = ours([w]), theirs([tw])
    for _ in range(5):
        loss = (((ct.Tensor(x) @ w.T - ct.Tensor(y)) ** 2.0).mean())
        opt.zero_grad()
        loss.backward()
        opt.step()
        tloss = ((torch.tensor(x) @ tw.T - torch.tensor(y)) ** 2).mean()
        topt.zero_grad()
        tloss.backward()
        topt.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------ data

def test_dataloader_shuffles_and_covers_everything():
    x, y = np.arange(23.0).reshape(23, 1), np.arange(23)
    loader = ct.DataLoader(x, y, batch_size=5, seed=1)
    batches = list(loader)
    assert len(loader) == 5 and [len(b[1]) for b in batches] == [5, 5, 5, 5, 3]
    seen = np.concatenate([b[1] for b in batches])
    assert sorted(seen) == list(range(23)) and list(seen) != list(range(23))
    for xb, yb in batches:
        np.testing.assert_array_equal(xb.numpy()[:, 0], yb)
    assert len(ct.DataLoader(x, y, batch_size=5, drop_last=True)) == 4


# ------------------------------------------------------------------ backend selection

def test_backend_selection():
    from course_lib.tensor import backend as B
    assert ct.current_backend_name() == "numpy" and "numpy" in ct.available_backends()
    with ct.use_backend("numpy") as b:
        assert b is ct.get_backend("numpy")
    with pytest.raises(ct.BackendUnavailable, match="unknown backend 'tpu'"):
        ct.set_backend("tpu")
    assert ct.current_backend_name() == "numpy"
    assert {"numpy", "numba", "cuda"} <= set(B.REGISTRY)  # the built-in three (a test may have added a yours-* one)
    for name in ("numba", "cuda"):
        ok, why = ct.backend_status(name)
        assert ok or why  # unavailable backends say why


def test_default_where_of_the_base_class():
    """The base class's `where` (for backends that do not override it) agrees with numpy."""
    b = ct.get_backend("numpy")
    rng = np.random.default_rng(0)
    c = (rng.random((3, 1)) > 0.5).astype(np.float64)
    x, y = rng.standard_normal((3, 4)), rng.standard_normal(4)
    td = [TensorData.from_numpy(v, np.float64) for v in (c, x, y)]
    out = ct.Backend.where(b, *td).to_numpy()
    np.testing.assert_array_equal(out, np.where(c > 0, x, y))


def test_a_parameter_without_gradient_keeps_its_value():
    a, b = nn.Parameter(np.ones(3)), nn.Parameter(np.full(2, 5.0))
    opt = optim.Adam([a, b], lr=0.1)
    (a * 2.0).sum().backward()
    opt.step()
    np.testing.assert_allclose(a.numpy(), 0.9)
    np.testing.assert_array_equal(b.numpy(), [5.0, 5.0])


def test_engine_rejects_a_gradient_of_the_wrong_shape():
    class Forgetful(ct.Function):
        """x + b that forgets to sum b's gradient back to b's shape."""
        @staticmethod
        def forward(ctx, x, b):
            return (x.detach() + b.detach()).data

        @staticmethod
        def backward(ctx, grad):
            return grad, grad

    x, b = ct.randn(3, 4, requires_grad=True), ct.randn(4, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Forgetful.backward returned a gradient of shape \(3, 4\) "
                                           r"for an input of shape \(4,\)"):
        Forgetful.apply(x, b).sum().backward()


def test_a_backend_written_elsewhere_plugs_in():
    """register_backend: an object with map, zip, reduce and matmul runs the whole library."""
    from course_lib.tensor import backend as B

    numpy_backend = B.get_backend("numpy")
    calls = []

    class Counting:
        name = "counting"

        def __getattr__(self, method):  # map, zip, reduce, matmul: count, then let numpy compute
            def run(*args, **kwargs):
                calls.append(method)
                return getattr(numpy_backend, method)(*args, **kwargs)
            return run

    with B.registered_backend("counting", Counting()):
        rng = np.random.default_rng(3)
        a, b = rng.normal(size=(3, 4)), rng.normal(size=(4, 2))
        with B.use_backend("counting"):
            x, y = ct.Tensor(a, requires_grad=True), ct.Tensor(b, requires_grad=True)
            loss = (x @ y).relu().sum()
            loss.backward()
        ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
        (ta @ tb).relu().sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), ta.grad.numpy(), rtol=1e-12)
        assert {"matmul", "map", "reduce"} <= set(calls)
        assert B.current_backend_name() == "numpy"
    assert "counting" not in B.available_backends()
    with pytest.raises(TypeError, match="lacks"):
        B.register_backend("broken", object())


def test_a_backend_registered_for_a_block_leaves_the_registry_as_it_was():
    """registered_backend scopes a backend to a block and puts back what the name held before;
    unregister_backend forgets one, but never the backend in use."""
    from course_lib.tensor import backend as B

    numpy_backend = B.get_backend("numpy")
    before = B.available_backends()
    with B.registered_backend("numpy", numpy_backend) as inner, B.registered_backend("mine", numpy_backend):
        assert inner is numpy_backend and "mine" in B.available_backends()
    assert B.available_backends() == before and B.get_backend("numpy") is numpy_backend
    B.register_backend("mine", numpy_backend)
    with B.use_backend("mine"), pytest.raises(RuntimeError, match="in use"):
        B.unregister_backend("mine")
    B.unregister_backend("mine")
    assert B.available_backends() == before
    with pytest.raises(KeyError, match="no backend 'mine'"):
        B.unregister_backend("mine")


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_weight_gradient_comes_out_in_the_weights_layout(backend, monkeypatch):
    """Linear multiplies by weight.T; the weight's gradient is computed column-major, so its transpose
    back to the weight is row-major and accumulating it copies nothing. Values as torch's."""
    rng = np.random.default_rng(8)
    x, w = rng.standard_normal((13, 7)), rng.standard_normal((5, 7))
    with ct.use_backend(backend) as engine:
        layer = nn.Linear(7, 5, dtype=np.float64)
        layer.weight.copy_(ct.Tensor(w))
        loss = (layer(ct.Tensor(x)) ** 2.0).sum()
        copies, map_ = [], engine.map
        monkeypatch.setattr(engine, "map", lambda op, *a, **k: copies.append(op) or map_(op, *a, **k))
        loss.backward()
    assert "id" not in copies, "the weight's gradient was copied (a transposed layout made contiguous)"
    tw = torch.tensor(w, requires_grad=True)
    ((torch.tensor(x) @ tw.T + torch.tensor(layer.bias.numpy())) ** 2).sum().backward()
    assert layer.weight.grad.data.strides == (7, 1)
    np.testing.assert_allclose(layer.weight.grad.numpy(), tw.grad.numpy(), rtol=1e-12, atol=1e-12)
