"""Training the capstone GPT: chapter 04's loop, on course_lib.tensor.

The same recipe as course_lib/gpt/trainer.py: AdamW that decays only matrices, warmup plus cosine
learning rate (`lr_at`, reused), global gradient-norm clipping, evaluation on both splits. Batches
come from chapter 04's `make_get_batch` (torch LongTensors, read here as numpy arrays).

`compare_training` runs chapter 04's PyTorch GPT and this one side by side: the same initial
weights, the same batches, the same schedule; it returns both loss curves.

    history = train(model, get_batch, TrainConfig(max_iters=500))
"""

import time

import numpy as np
import torch

from course_lib.capstone.model import GPT
from course_lib.gpt import configure_optimizer as torch_optimizer
from course_lib.gpt import make_get_batch
from course_lib.gpt import train_step as torch_step
from course_lib.gpt.model import GPT as TorchGPT
from course_lib.gpt.trainer import TrainConfig, lr_at
from course_lib.tensor import no_grad, optim


def configure_optimizer(model, cfg):
    """AdamW that decays only matrices (linear weights, embeddings); biases and LayerNorm gains are not."""
    params = model.parameters()
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas))


def train_step(model, optimizer, x, y, grad_clip=1.0):
    """One step: forward, backward, clip the global gradient norm, update. Returns the loss."""
    _, loss = model(x, y)
    optimizer.zero_grad()
    loss.backward()
    if grad_clip:
        optim.clip_grad_norm_(optimizer.params, grad_clip)
    optimizer.step()
    return loss.item()


def estimate_loss(model, get_batch, eval_iters):
    """Mean loss over `eval_iters` batches of each split, in eval mode (no dropout)."""
    was_training = model.training
    model.eval()
    out = {}
    with no_grad():
        for split in ("train", "val"):
            out[split] = float(np.mean([model(*get_batch(split))[1].item() for _ in range(eval_iters)]))
    model.train(was_training)
    return out


def train(model, get_batch, cfg: TrainConfig, make_optimizer=configure_optimizer):
    """Train for cfg.max_iters steps; returns the history (as chapter 04's `train`, without the progress bar):
    iter, lr, loss per step; eval_iter, train_loss, val_loss per evaluation; ms_per_iter (median step).
    make_optimizer(model, cfg) makes the optimizer (chapter 12's payoff passes one whose update is yours)."""
    optimizer = make_optimizer(model, cfg)
    history = {"iter": [], "lr": [], "loss": [], "eval_iter": [], "train_loss": [], "val_loss": []}
    step_ms = []

    def evaluate(it):
        losses = estimate_loss(model, get_batch, cfg.eval_iters)
        history["eval_iter"].append(it)
        history["train_loss"].append(losses["train"])
        history["val_loss"].append(losses["val"])

    model.train()
    for it in range(cfg.max_iters):
        if cfg.eval_interval and it % cfg.eval_interval == 0:
            evaluate(it)
        t0 = time.perf_counter()
        optimizer.lr = lr_at(it, cfg)
        x, y = get_batch("train")
        history["loss"].append(train_step(model, optimizer, x, y, cfg.grad_clip))
        step_ms.append(1000 * (time.perf_counter() - t0))
        history["iter"].append(it)
        history["lr"].append(optimizer.lr)
    evaluate(cfg.max_iters)
    history["ms_per_iter"] = float(np.median(step_ms)) if step_ms else float("nan")
    return history


def compare_training(config, cfg: TrainConfig, tokens, steps, dtype=np.float64, seed=1337, gpt=GPT,
                     make_optimizer=configure_optimizer, keep=None):
    """Train chapter 04's PyTorch GPT and the capstone GPT side by side for `steps` steps from the same
    initial weights on the same batches; returns (torch losses, course losses), one per step.

    The course GPT (`gpt`, a class like GPT, with `make_optimizer(model, cfg)`) runs on the current
    backend of course_lib.tensor. A dict `keep` receives the two trained models ("torch", "course")."""
    torch.manual_seed(seed)
    reference = TorchGPT(config).to(torch.float64 if dtype == np.float64 else torch.float32)
    ours = gpt.from_torch(reference)
    losses = {"torch": [], "course": []}
    for name, model, make_opt, step in (("torch", reference, torch_optimizer, torch_step),
                                        ("course", ours, make_optimizer, train_step)):
        get_batch = make_get_batch(tokens, config.block_size, cfg.batch_size, seed=seed)  # the same batches
        optimizer = make_opt(model, cfg)
        model.train()
        for it in range(steps):
            lr = lr_at(it, cfg)
            if name == "torch":
                for group in optimizer.param_groups:
                    group["lr"] = lr
            else:
                optimizer.lr = lr
            losses[name].append(step(model, optimizer, *get_batch("train"), cfg.grad_clip))
        if keep is not None:
            keep[name] = model
    return losses["torch"], losses["course"]
