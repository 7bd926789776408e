"""The training loop: schedule, optimizer groups, clipping, batches, a short run, checkpoints."""

import math

import pytest
import torch

from course_lib.gpt import (
    TrainConfig,
    configure_optimizer,
    load_checkpoint,
    lr_at,
    make_get_batch,
    save_checkpoint,
    train,
    train_step,
)
from course_lib.gpt.model import GPT, GPTConfig


def test_lr_schedule_warms_up_then_follows_the_cosine():
    cfg = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_iters=10, lr_decay_iters=110)
    assert lr_at(0, cfg) == pytest.approx(1e-4)
    assert lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(60, cfg) == pytest.approx(1e-4 + 0.5 * 9e-4)                 # halfway down the cosine
    assert lr_at(35, cfg) == pytest.approx(1e-4 + 0.5 * (1 + math.cos(math.pi / 4)) * 9e-4)
    assert lr_at(110, cfg) == lr_at(5000, cfg) == 1e-4
    lrs = [lr_at(i, cfg) for i in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_weight_decay_only_on_matrices():
    model = GPT(GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16))
    decay, no_decay = configure_optimizer(model, TrainConfig(weight_decay=0.1)).param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_get_batch_windows_are_shifted_and_split_90_10():
    tokens = torch.arange(1000)
    gb = make_get_batch(tokens, block_size=7, batch_size=5, seed=1)
    x, y = gb("train")
    assert x.shape == y.shape == (5, 7) and x.dtype == torch.long
    assert torch.equal(y, x + 1) and x.max() < 900
    xv, _ = gb("val")
    assert xv.min() >= 900
    again = make_get_batch(tokens, block_size=7, batch_size=5, seed=1)("train")[0]
    assert torch.equal(again, x)


class Toy(torch.nn.Module):
    """A bigram model: the smallest thing with the (logits, loss) interface."""

    def __init__(self, vocab):
        super().__init__()
        self.table = torch.nn.Embedding(vocab, vocab)
        self.bias = torch.nn.Parameter(torch.zeros(vocab))

    def forward(self, idx, targets=None):
        logits = self.table(idx) + self.bias
        loss = None if targets is None else torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def test_train_step_clips_the_global_norm():
    torch.manual_seed(0)
    model = Toy(11)
    x, y = torch.randint(0, 11, (4, 6)), torch.randint(0, 11, (4, 6))
    model(x, y)[1].backward()
    full = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    before = [p.detach().clone() for p in model.parameters()]
    train_step(model, opt, x, y, grad_clip=full / 3)
    step = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])
    assert step.norm().item() == pytest.approx(full / 3, rel=1e-4)   # SGD, lr 1: the step is the clipped gradient


def test_train_learns_a_pattern_and_records_history():
    tokens = torch.tensor([0, 1, 2, 3, 4, 5, 6] * 200)           # each token determines the next
    cfg = TrainConfig(max_iters=60, lr=0.1, min_lr=0.01, warmup_iters=5, lr_decay_iters=60,
                      eval_interval=20, eval_iters=4, seed=0)
    h = train(Toy(7), make_get_batch(tokens, 8, 4, seed=0), cfg, progress=False)
    assert h["eval_iter"] == [0, 20, 40, 60] and len(h["loss"]) == len(h["lr"]) == 60
    assert h["val_loss"][-1] < 0.3 * h["val_loss"][0]
    assert h["ms_per_iter"] > 0


def test_checkpoint_round_trip_with_weights_only(tmp_path):
    config = GPTConfig(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=8)
    torch.manual_seed(0)
    model = GPT(config)
    cfg = TrainConfig(max_iters=3, eval_interval=0, eval_iters=1)
    opt = configure_optimizer(model, cfg)
    train(model, make_get_batch(torch.randint(0, 13, (200,)), 8, 2), cfg, progress=False, optimizer=opt)
    save_checkpoint(tmp_path / "ck.pt", model, opt, config, cfg, iter_num=3)
    fresh = GPT(GPTConfig(**load_checkpoint(tmp_path / "ck.pt")["model_config"]))
    opt2 = configure_optimizer(fresh, cfg)
    ckpt = load_checkpoint(tmp_path / "ck.pt", fresh, opt2)
    assert ckpt["iter_num"] == 3
    assert TrainConfig(**ckpt["train_config"]) == TrainConfig(**{**vars(cfg), "betas": tuple(cfg.betas)})
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)
    assert opt2.state_dict()["state"].keys() == opt.state_dict()["state"].keys()


def test_configure_optimizer_uses_the_fused_adamw_and_steps_like_the_loop():
    """One fused kernel per step on CPU tensors; the same updates as PyTorch's per-tensor AdamW."""
    torch.manual_seed(0)
    a = GPT(GPTConfig(vocab_size=31, block_size=8, n_layer=2, n_head=2, n_embd=16)).double()
    b = GPT(GPTConfig(vocab_size=31, block_size=8, n_layer=2, n_head=2, n_embd=16)).double()
    b.load_state_dict(a.state_dict())
    cfg = TrainConfig(lr=3e-3, weight_decay=0.1)
    fused = configure_optimizer(a, cfg)
    assert fused.defaults["fused"] is True
    loop = torch.optim.AdamW([{"params": [p for p in b.parameters() if p.ndim >= 2], "weight_decay": 0.1},
                              {"params": [p for p in b.parameters() if p.ndim < 2], "weight_decay": 0.0}],
                             lr=cfg.lr, betas=tuple(cfg.betas), foreach=False, fused=False)
    x = torch.randint(0, 31, (3, 8))
    for _ in range(3):
        train_step(a, fused, x, x.roll(1, 1)), train_step(b, loop, x, x.roll(1, 1))
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12, msg=name)
