"""The course optimizers' parameter groups against torch.optim, in float64: every group has its own lr
(and weight decay, and for SGD momentum), a schedule sets lr through `param_groups` or `optimizer.lr`,
and `zero_grad(set_to_none=False)` keeps zeros. On the numpy backend and on the Numba one, whose fused
Adam kernel takes one lr: with groups that disagree, the step goes the tensor way and still matches.

Shapes are drawn at random (odd sizes included); gradients are random, never ones.
"""

import zlib

import numpy as np
import pytest
import torch

import course_lib.tensor as ct
from course_lib.tensor import nn, optim, use_backend

TOL = dict(rtol=1e-10, atol=1e-12)

KINDS = {
    "sgd": (lambda g: optim.SGD(g, lr=0.05, momentum=0.9, weight_decay=0.01),
            lambda g: torch.optim.SGD(g, lr=0.05, momentum=0.9, weight_decay=0.01)),
    "adam": (lambda g: optim.Adam(g, lr=0.01, betas=(0.9, 0.99), weight_decay=0.05),
             lambda g: torch.optim.Adam(g, lr=0.01, betas=(0.9, 0.99), weight_decay=0.05)),
    "adamw": (lambda g: optim.AdamW(g, lr=0.01, betas=(0.9, 0.99)),
              lambda g: torch.optim.AdamW(g, lr=0.01, betas=(0.9, 0.99))),
}


@pytest.fixture(params=["numpy", "numba"])
def backend(request):
    with use_backend(request.param):
        yield request.param


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))  # a fixed seed per test


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
