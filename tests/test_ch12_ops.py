"""The ops chapter 12's GPT needs, against PyTorch in float64, forward and backward, on the numpy and
the Numba backends: embedding (repeated indices), layer norm, both GELUs, masked_fill and where,
4-D softmax, broadcast batched matmul, seeded dropout, AdamW with groups and gradient clipping,
and the optimizers' parameter groups (each its own lr, a schedule, zero_grad(set_to_none=False)).

Shapes are drawn at random (odd sizes included); the upstream gradient is random, never ones.
"""

import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import course_lib.tensor as ct
from course_lib.tensor import functions, nn, optim, use_backend
from course_lib.tensor.autodiff import topological_order

TOL = dict(rtol=1e-10, atol=1e-12)


@pytest.fixture(params=["numpy", "numba"])
def backend(request):
    with use_backend(request.param):
        yield request.param


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))  # a fixed seed per test


def pair(array):
    """The same float64 values as a course tensor and a torch tensor, both requiring grad."""
    return ct.Tensor(array, requires_grad=True, dtype=np.float64), torch.tensor(array, requires_grad=True)


def close(ours, theirs):
    np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), **TOL)


def backward_both(out, ref, rng):
    """Backpropagate the same random upstream gradient through both graphs."""
    g = rng.standard_normal(ref.shape)
    out.backward(ct.Tensor(g, dtype=np.float64))
    ref.backward(torch.tensor(g))


def shape(rng, n):
    return tuple(int(d) for d in rng.integers(1, 8, n))


def test_embedding_scatter_adds_repeated_indices(backend, rng):
    for _ in range(3):
        vocab, dim = int(rng.integers(3, 12)), int(rng.integers(1, 9))
        idx = rng.integers(0, vocab, shape(rng, 2) + (5,))     # 5+ lookups from a small vocab: repeats
        emb = nn.Embedding(vocab, dim, dtype=np.float64)
        ref = torch.nn.Embedding(vocab, dim).double()
        emb.load_state_dict(ref.state_dict())
        out, want = emb(idx), ref(torch.tensor(idx))
        close(out, want)
        backward_both(out, want, rng)
        close(emb.weight.grad, ref.weight.grad)
    assert len(np.unique(idx)) < idx.size


def test_layer_norm(backend, rng):
    for _ in range(3):
        s = shape(rng, 2) + (int(rng.integers(2, 20)),)
        ln = nn.LayerNorm(s[-1], dtype=np.float64)
        ref = torch.nn.LayerNorm(s[-1]).double()
        with torch.no_grad():
            ref.weight.copy_(torch.tensor(rng.uniform(0.5, 2, s[-1])))
            ref.bias.copy_(torch.tensor(rng.standard_normal(s[-1])))
        ln.load_state_dict(ref.state_dict())
        x, xt = pair(rng.standard_normal(s) * 3 + 1)
        out, want = ln(x), ref(xt)
        close(out, want)
        backward_both(out, want, rng)
        close(x.grad, xt.grad)
        close(ln.weight.grad, ref.weight.grad)
        close(ln.bias.grad, ref.bias.grad)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu(backend, rng, approximate):
    x, xt = pair(rng.uniform(-6, 6, shape(rng, 3)))
    out, want = x.gelu(approximate), F.gelu(xt, approximate=approximate)
    close(out, want)
    backward_both(out, want, rng)
    close(x.grad, xt.grad)
    close(nn.GELU(approximate)(x), want)


def test_gelu_rejects_unknown_form():
    with pytest.raises(ValueError, match="approximate"):
        ct.randn(3).gelu("erf")


@pytest.mark.parametrize("value", [float("-inf"), -2.5])
def test_masked_fill_with_a_broadcast_mask(backend, rng, value):
    B, H, T = shape(rng, 3)
    x, xt = pair(rng.standard_normal((B, H, T, T + 1)))
    mask = rng.random((T, T + 1)) < 0.4
    out, want = x.masked_fill(mask, value), xt.masked_fill(torch.tensor(mask), value)
    close(out, want)
    if value == -2.5:
        backward_both(out, want, rng)
        close(x.grad, xt.grad)


def test_masked_fill_checks_the_mask_shape():
    with pytest.raises(ct.ShapeError, match="masked_fill"):
        ct.randn(2, 3).masked_fill(np.zeros((4, 3), bool), 0.0)


def test_where(backend, rng):
    s = shape(rng, 3)
    a, at = pair(rng.standard_normal(s))
    b, bt = pair(rng.standard_normal(s[1:]))
    cond = rng.random(s) < 0.5
    out = ct.where(ct.Tensor(cond.astype(np.float64), dtype=np.float64), a, b)
    want = torch.where(torch.tensor(cond), at, bt)
    close(out, want)
    backward_both(out, want, rng)
    close(a.grad, at.grad)
    close(b.grad, bt.grad)


def test_causal_softmax_over_the_last_dim_of_4d(backend, rng):
    B, H, T = shape(rng, 3)
    x, xt = pair(rng.standard_normal((B, H, T, T)) * 4)
    future = np.triu(np.ones((T, T), bool), k=1)
    out = x.masked_fill(future, float("-inf")).softmax(-1)
    want = xt.masked_fill(torch.tensor(future), float("-inf")).softmax(-1)
    close(out, want)
    backward_both(out, want, rng)
    close(x.grad, xt.grad)


@pytest.mark.parametrize("shapes", [((2, 3, 5, 4), (2, 3, 4, 7)), ((2, 1, 5, 4), (3, 4, 6)),
                                    ((5, 4), (2, 3, 4, 1)), ((3, 1, 2, 9, 4), (2, 4, 3))])
def test_batched_matmul_broadcasts(backend, rng, shapes):
    a, at = pair(rng.standard_normal(shapes[0]))
    b, bt = pair(rng.standard_normal(shapes[1]))
    out, want = a @ b, at @ bt
    close(out, want)
    backward_both(out, want, rng)
    close(a.grad, at.grad)
    close(b.grad, bt.grad)


def test_dropout_is_seeded_and_scales_what_it_keeps(backend, rng):
    p, s = 0.3, shape(rng, 2) + (257,)
    x, xt = pair(rng.standard_normal(s))
    layer = nn.Dropout(p, generator=np.random.default_rng(5))
    out = layer(x)
    again = nn.Dropout(p, generator=np.random.default_rng(5))(x)
    np.testing.assert_array_equal(out.numpy(), again.numpy())          # same seed, same mask
    keep = out.numpy() != 0
    assert abs(keep.mean() - (1 - p)) < 0.1
    want = xt * torch.tensor(keep) / (1 - p)                            # torch's dropout, given that mask
    close(out, want)
    backward_both(out, want, rng)
    close(x.grad, xt.grad)
    assert nn.Dropout(p).eval()(x) is x


def test_split(backend, rng):
    x, xt = pair(rng.standard_normal((3, 4, 11)))
    for ours, theirs in zip(x.split(4, dim=2), xt.split(4, dim=2)):
        close(ours, theirs)
    (x.split(4, dim=2)[1] * 2.0).sum().backward()
    (xt.split(4, dim=2)[1] * 2.0).sum().backward()
    close(x.grad, xt.grad)


def test_tied_parameters_are_listed_once_and_saved_under_both_names():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 4)
            self.b = nn.Linear(3, 4)
            self.b.weight = self.a.weight

    m = Tied()
    assert [n for n, _ in m.named_parameters()] == ["a.weight", "a.bias", "b.bias"]
    assert set(m.state_dict()) == {"a.weight", "a.bias", "b.weight", "b.bias"}


def test_adamw_with_groups_and_clipping_matches_torch(backend, rng):
    shapes = [shape(rng, 2), (int(rng.integers(1, 9)),), shape(rng, 2)]
    values = [rng.standard_normal(s) for s in shapes]
    ours = [nn.Parameter(v, dtype=np.float64) for v in values]
    theirs = [torch.tensor(v, requires_grad=True) for v in values]

    def groups(ps):
        return [{"params": [ps[0], ps[2]], "weight_decay": 0.1}, {"params": [ps[1]], "weight_decay": 0.0}]

    opt = optim.AdamW(groups(ours), lr=1e-2, betas=(0.9, 0.99))
    ref = torch.optim.AdamW(groups(theirs), lr=1e-2, betas=(0.9, 0.99))
    for step in range(6):
        scale = 10.0 if step % 2 else 0.1          # big gradients get clipped, small ones do not
        for p, q in zip(ours, theirs):
            g = rng.standard_normal(p.shape) * scale
            p.grad, q.grad = ct.Tensor(g, dtype=np.float64), torch.tensor(g)
        norm = optim.clip_grad_norm_(ours, 1.0)
        want = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
        assert abs(norm - want.item()) < 1e-9 * want.item()
        opt.lr = 1e-2 * (step + 1) / 6
        for group in ref.param_groups:
            group["lr"] = opt.lr
        opt.step()
        ref.step()
        for p, q in zip(ours, theirs):
            close(p, q)


# ---- parameter groups: each its own lr (and decay, and momentum), as torch.optim -------------------------
# The Numba backend's fused Adam kernel takes one lr: with groups that disagree the step goes the tensor
# way and still matches.

KINDS = {
    "sgd": (lambda g: optim.SGD(g, lr=0.05, momentum=0.9, weight_decay=0.01),
            lambda g: torch.optim.SGD(g, lr=0.05, momentum=0.9, weight_decay=0.01)),
    "adam": (lambda g: optim.Adam(g, lr=0.01, betas=(0.9, 0.99), weight_decay=0.05),
             lambda g: torch.optim.Adam(g, lr=0.01, betas=(0.9, 0.99), weight_decay=0.05)),
    "adamw": (lambda g: optim.AdamW(g, lr=0.01, betas=(0.9, 0.99)),
              lambda g: torch.optim.AdamW(g, lr=0.01, betas=(0.9, 0.99))),
}


def twin_parameters(rng):
    """Four parameters of random shapes (vectors and matrices), as course Parameters and torch tensors."""
    shapes = [tuple(int(d) for d in rng.integers(1, 9, 2)), (int(rng.integers(1, 13)),),
              tuple(int(d) for d in rng.integers(1, 9, 2)), (int(rng.integers(1, 13)),)]
    values = [rng.standard_normal(s) for s in shapes]
    return [nn.Parameter(v, dtype=np.float64) for v in values], [torch.tensor(v, requires_grad=True) for v in values]


def two_groups(ps):
    """Matrices decayed at a higher lr; vectors not decayed, at a third of it (with momentum 0 for SGD)."""
    return [{"params": [ps[0], ps[2]], "weight_decay": 0.1},
            {"params": [ps[1], ps[3]], "weight_decay": 0.0, "lr": 0.003, "momentum": 0.0}]


def set_gradients(rng, ours, theirs):
    for p, q in zip(ours, theirs):
        g = rng.standard_normal(p.shape)
        p.grad, q.grad = ct.Tensor(g, dtype=np.float64), torch.tensor(g)


def assert_same(ours, theirs, step):
    for i, (p, q) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(p.numpy(), q.detach().numpy(), **TOL,
                                   err_msg=f"parameter {i} after step {step} differs from torch.optim's")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_two_groups_with_their_own_lr_and_decay_match_torch(kind, backend, rng):
    ours, theirs = twin_parameters(rng)
    make_ours, make_theirs = KINDS[kind]
    opt, ref = make_ours(two_groups(ours)), make_theirs(two_groups(theirs))
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in ref.param_groups]
    for step in range(4):
        set_gradients(rng, ours, theirs)
        opt.step()
        ref.step()
        assert_same(ours, theirs, step)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_schedule_set_through_param_groups_is_read_each_step(kind, backend, rng):
    """Each group's lr changes every step (the first group's warms up, the second's decays): a flat lr
    built once and kept would apply the first step's numbers forever."""
    ours, theirs = twin_parameters(rng)
    make_ours, make_theirs = KINDS[kind]
    opt, ref = make_ours(two_groups(ours)), make_theirs(two_groups(theirs))
    for step in range(5):
        for a, b, lr in zip(opt.param_groups, ref.param_groups, (0.02 * (step + 1) / 5, 0.01 / (step + 1))):
            a["lr"] = b["lr"] = lr
        set_gradients(rng, ours, theirs)
        opt.step()
        ref.step()
        assert_same(ours, theirs, step)


def test_setting_optimizer_lr_sets_every_group(backend, rng):
    ours, theirs = twin_parameters(rng)
    opt, ref = optim.AdamW(two_groups(ours), lr=0.01), torch.optim.AdamW(two_groups(theirs), lr=0.01)
    assert isinstance(opt.lr, ct.Tensor)                     # groups disagree: one lr per parameter entry
    for step in range(3):
        opt.lr = 0.004 * (step + 1)
        for group in ref.param_groups:
            group["lr"] = opt.lr
        assert [g["lr"] for g in opt.param_groups] == [opt.lr, opt.lr] and opt.lr == 0.004 * (step + 1)
        set_gradients(rng, ours, theirs)
        opt.step()
        ref.step()
        assert_same(ours, theirs, step)


def test_the_fused_kernel_runs_when_groups_share_one_lr_and_not_otherwise(rng, monkeypatch):
    backend = ct.get_backend("numba")
    calls = []
    fused = backend.adam
    monkeypatch.setattr(backend, "adam", lambda *a: calls.append(a[4]) or fused(*a), raising=False)
    ours, theirs = twin_parameters(rng)
    opt, ref = optim.AdamW(two_groups(ours), lr=0.01), torch.optim.AdamW(two_groups(theirs), lr=0.01)
    with use_backend("numba"):
        for step, lrs in enumerate([(0.01, 0.003), (0.02, 0.02), (0.01, 0.005)]):
            for a, b, lr in zip(opt.param_groups, ref.param_groups, lrs):
                a["lr"] = b["lr"] = lr
            set_gradients(rng, ours, theirs)
            opt.step()
            ref.step()
            assert_same(ours, theirs, step)
    assert calls == [0.02], "the fused kernel takes one lr: it should run at the step whose groups agree only"


def test_zero_grad_sets_to_none_or_keeps_zeros_as_torch(rng):
    ours, theirs = twin_parameters(rng)
    opt, ref = optim.SGD(ours, lr=0.1), torch.optim.SGD(theirs, lr=0.1)
    set_gradients(rng, ours[:3], theirs[:3])                    # the last parameter gets no gradient
    opt.zero_grad(set_to_none=False)
    ref.zero_grad(set_to_none=False)
    for p, q in zip(ours, theirs):
        assert (p.grad is None) == (q.grad is None)
        if p.grad is not None:
            assert p.grad.shape == p.shape and p.grad.dtype == p.dtype
            np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
    x = rng.standard_normal(ours[0].shape)
    (ours[0] * ct.Tensor(x, dtype=np.float64)).sum().backward()   # the next backward adds to the zeros
    np.testing.assert_array_equal(ours[0].grad.numpy(), x)
    opt.zero_grad()
    assert all(p.grad is None for p in ours)


def test_a_group_without_lr_takes_the_constructors(rng):
    ours, _ = twin_parameters(rng)
    opt = optim.Adam([{"params": ours[:2]}, {"params": ours[2:], "lr": 0.5}], lr=0.25)
    assert [g["lr"] for g in opt.param_groups] == [0.25, 0.5]
    opt = optim.SGD(ours, lr=0.125)
    assert opt.lr == 0.125 and opt.param_groups[0]["lr"] == 0.125
    assert optim.Adam([], lr=0.5).lr == 0.5                    # no parameters (chapter 02 calls update alone)


# ---- the op registry: the library's declared plug-in point for Functions and the backward's order --------

def test_use_ops_puts_a_function_in_for_the_block_only():
    class Doubling(ct.Function):
        @staticmethod
        def forward(ctx, a, b):
            return ct.TensorData.from_numpy(a.numpy() * 2.0, a.dtype)

        @staticmethod
        def backward(ctx, grad):
            return grad * 2.0, None

    a = ct.Tensor(np.arange(3.0), requires_grad=True, dtype=np.float64)
    with ct.use_ops(Mul=Doubling) as ops:
        assert ops.Mul is Doubling and "Mul=" in repr(ops)
        with ct.use_ops(Mul=functions.Mul):                 # blocks nest; the innermost wins
            assert (a * 5.0).numpy().tolist() == [0.0, 5.0, 10.0]
        doubled = a * 5.0
    assert doubled._fn is Doubling and doubled.numpy().tolist() == [0.0, 2.0, 4.0]
    assert ct.OPS.Mul is functions.Mul and (a * 5.0)._fn is functions.Mul


def test_use_ops_rejects_an_unknown_name_and_restores_on_errors():
    with pytest.raises(KeyError, match="no op named Mull"):
        with ct.use_ops(Mull=object):
            pass
    with pytest.raises(RuntimeError):
        with ct.use_ops(Softmax=object):
            raise RuntimeError("boom")
    assert ct.OPS.Softmax.__module__ == "course_lib.tensor.functions"


def test_the_backward_walks_the_order_the_registry_gives():
    walked = []

    def order(root):
        nodes = topological_order(root)
        walked.append(len(nodes))
        return nodes

    x = ct.Tensor(np.array([1.0, 2.0]), requires_grad=True, dtype=np.float64)
    with ct.use_ops(topological_order=order):
        ((x * x).sum()).backward()
    assert walked == [4] and x.grad.numpy().tolist() == [2.0, 4.0]
