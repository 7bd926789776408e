"""The CUDA backend of the tensor engine against the numpy backend, on strided views.

The full op suite (tests/test_ch02_ops.py) also runs on this backend; these tests pin the
strided cases the backend itself must get right: permuted, expanded, offset and 0-d views,
an `out` that is a slice of a bigger array, empty tensors and batched, broadcast matmul.
"""

import numpy as np
import pytest

from course_lib.cuda.backend import backend as cu
from course_lib.tensor import MAP_OPS, ZIP_OPS, TensorData, get_backend

npb = get_backend("numpy")


def data(rng, shape, dtype=np.float64, low=-2.0, high=2.0):
    return TensorData.from_numpy(rng.uniform(low, high, shape), dtype=dtype)


def same(ours, ref, rtol=1e-12, atol=1e-12):
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    np.testing.assert_allclose(ours.to_numpy(), ref.to_numpy(), rtol=rtol, atol=atol, equal_nan=True)


@pytest.fixture
def rng():
    return np.random.default_rng(3)


def test_every_map_op_on_a_permuted_view(rng):
    a = data(rng, (3, 5)).permute(1, 0)
    for op in MAP_OPS:
        x = TensorData.from_numpy(np.abs(a.to_numpy()) + 0.1, np.float64) if op in ("log", "sqrt") else a
        same(cu.map(op, x), npb.map(op, x))


def test_every_zip_op_with_broadcasting(rng):
    a, b = data(rng, (2, 3, 5)), data(rng, (3, 1), low=0.5, high=2.0)
    for op in ZIP_OPS:
        x = TensorData.from_numpy(np.abs(a.to_numpy()), np.float64) if op == "pow" else a
        same(cu.zip(op, x, b), npb.zip(op, x, b))


def test_zip_keeps_the_wider_dtype_and_handles_0d(rng):
    a, s = data(rng, (4,), np.float32), TensorData.from_numpy(1.25, np.float64)
    same(cu.zip("mul", a, s), npb.zip("mul", a, s))
    same(cu.map("exp", s), npb.map("exp", s))


def test_map_into_a_strided_out_slice(rng):
    b = data(rng, (5,))
    big, ref = TensorData.zeros((4, 5), np.float64), TensorData.zeros((4, 5), np.float64)
    for store in (big, ref):
        rows = TensorData(store.storage, (2, 5), (10, 1), 5)          # rows 1 and 3
        (cu if store is big else npb).map("id", b, rows)
    same(big, ref)


def test_reduce_every_dim_of_an_offset_view(rng):
    base = data(rng, (5, 4, 6))
    view = TensorData(base.storage, (4, 3, 6), base.strides, base.offset + 24)   # rows 1.., columns ..3
    view = view.permute(2, 0, 1)
    for dim in range(3):
        for op in ("sum", "max"):
            same(cu.reduce(op, view, dim), npb.reduce(op, view, dim))


def test_inf_and_nan_like_numpy():
    x = TensorData.from_numpy([-1.0, 0.0, 800.0, -800.0], np.float64)
    for op in ("log", "sqrt", "inv", "exp", "sigmoid"):
        same(cu.map(op, x), npb.map(op, x))
    zero = TensorData.from_numpy([0.0, 0.0, -0.0], np.float64)
    same(cu.zip("div", TensorData.from_numpy([1.0, 0.0, 2.0], np.float64), zero),
         npb.zip("div", TensorData.from_numpy([1.0, 0.0, 2.0], np.float64), zero))


def test_empty_tensors(rng):
    e = TensorData.zeros((0, 3), np.float64)
    assert cu.map("exp", e).shape == (0, 3)
    assert cu.zip("add", e, data(rng, (3,))).shape == (0, 3)
    assert cu.matmul(data(rng, (2, 0)), data(rng, (0, 3))).to_numpy().tolist() == [[0.0] * 3] * 2


@pytest.mark.parametrize("sa, sb", [((2, 1, 7, 19), (3, 19, 5)), ((9, 4), (4, 11)), ((3, 17, 6), (6, 18))])
def test_batched_broadcast_matmul(rng, sa, sb):
    a, b = data(rng, sa), data(rng, sb)
    same(cu.matmul(a, b), npb.matmul(a, b), rtol=1e-10, atol=1e-10)


def test_matmul_of_transposed_float32(rng):
    a = data(rng, (9, 4), np.float32)
    same(cu.matmul(a.permute(1, 0), a), npb.matmul(a.permute(1, 0), a), rtol=1e-5, atol=1e-5)


# ---- tensors that stay on the device -----------------------------------------------------------------

def test_results_stay_on_the_device_until_the_host_reads_them(rng, monkeypatch):
    import course_lib.tensor as ct
    from course_lib.cuda import memory

    reads = []
    monkeypatch.setattr(memory.DeviceStorage, "copy_to_host",
                        lambda self, _real=memory.DeviceStorage.copy_to_host: reads.append(self.size) or _real(self))
    with ct.use_backend("cuda"):
        x = ct.Tensor(rng.uniform(-1, 1, (7, 5)), requires_grad=True)
        w = ct.Tensor(rng.uniform(-1, 1, (5, 3)), requires_grad=True)
        loss = ((x @ w).relu() * 0.5 + 1.0).sum()
        loss.backward()
        assert all(isinstance(t.data.storage, memory.DeviceStorage) for t in (loss, x.grad, w.grad))
        assert reads == []                                  # nothing came back while computing
        value = loss.item()
    assert reads == [1]                                     # .item() copies one number
    X, W = x.numpy(), w.numpy()
    np.testing.assert_allclose(value, (np.maximum(X @ W, 0) * 0.5 + 1.0).sum(), rtol=1e-12)


def test_the_pool_reuses_freed_device_memory():
    from course_lib.cuda import memory

    a = memory.DeviceStorage.empty(123, np.float32)
    array = a.array
    del a                                                   # back to the pool
    b = memory.DeviceStorage.empty(123, np.float32)
    assert b.array is array
    assert memory.DeviceStorage.empty(123, np.float64).array is not array


def test_fused_adam_equals_the_tensor_formula(rng):
    import course_lib.tensor as ct

    """One group, then two with different weight decays (one decay per parameter, as chapter 12 trains)."""
    p0, q0 = rng.uniform(-1, 1, 37), rng.uniform(-1, 1, 11)
    grads = [(rng.uniform(-1, 1, 37), rng.uniform(-1, 1, 11)) for _ in range(3)]
    for two_groups in (False, True):
        out = {}
        for name in ("numpy", "cuda"):
            p, q = ct.Tensor(p0, requires_grad=True), ct.Tensor(q0, requires_grad=True)
            groups = [{"params": [p]}, {"params": [q], "weight_decay": 0.0}] if two_groups else [p, q]
            opt = ct.optim.AdamW(groups, lr=1e-2, weight_decay=0.1)
            with ct.use_backend(name):
                for gp, gq in grads:
                    p.grad, q.grad = ct.Tensor(gp), ct.Tensor(gq)
                    opt.step()
            out[name] = np.concatenate([p.numpy(), q.numpy()])
        np.testing.assert_allclose(out["cuda"], out["numpy"], rtol=1e-12, atol=1e-14)


@pytest.mark.slow
def test_the_capstone_gpt_trains_like_the_numpy_backend():
    """Chapter 12's GPT, AdamW (two groups of weight decay) and clipping, two steps: the losses agree to float32
    rounding. About 15 s on the simulator (300 launches a step), so opt-in (--slow); a GPU runs a bigger one
    in benchmarks/gpu_verify.py."""
    import torch

    from course_lib.capstone import GPT, configure_optimizer, train_step
    from course_lib.gpt import TrainConfig, make_get_batch
    from course_lib.gpt.model import GPT as TorchGPT
    from course_lib.gpt.model import GPTConfig
    from course_lib.tensor import use_backend

    config = GPTConfig(vocab_size=11, block_size=6, n_layer=1, n_head=2, n_embd=8, dropout=0.0)
    cfg = TrainConfig(batch_size=2, warmup_iters=1)
    tokens = np.random.default_rng(1).integers(0, 11, 300)
    losses = {}
    for name in ("numpy", "cuda"):
        torch.manual_seed(1)
        model = GPT.from_torch(TorchGPT(config))
        opt = configure_optimizer(model, cfg)
        get_batch = make_get_batch(tokens, config.block_size, cfg.batch_size, seed=1)
        with use_backend(name):
            losses[name] = [float(train_step(model, opt, *get_batch("train"), cfg.grad_clip)) for _ in range(2)]
    np.testing.assert_allclose(losses["cuda"], losses["numpy"], rtol=1e-5)
