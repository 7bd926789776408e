"""Training the capstone GPT: chapter 04's recipe (course_lib/gpt/trainer.py), on course_lib.tensor.

The loop, the optimizer's groups, the schedule, clipping and evaluation are chapter 04's, written once;
what this chapter passes in is its library, `COURSE`: the course's AdamW, clip_grad_norm_ and no_grad.
Batches come from chapter 04's `make_get_batch` (torch LongTensors, read by the GPT as numpy arrays).

`compare_training` runs chapter 04's PyTorch GPT and this one side by side: the same initial
weights, the same batches, the same schedule; it returns both loss curves.

    history = train(model, get_batch, TrainConfig(max_iters=500))
"""

import numpy as np
import torch

from course_lib.capstone.model import GPT
from course_lib.gpt import make_get_batch, trainer
from course_lib.gpt.model import GPT as TorchGPT
from course_lib.gpt.trainer import TORCH, Library, TrainConfig, lr_at, set_lr
from course_lib.tensor import no_grad, optim

COURSE = Library("course_lib.tensor", optim.AdamW, optim.clip_grad_norm_, no_grad)


def configure_optimizer(model, cfg):
    """Chapter 04's AdamW groups (decay the matrices only), as the course's optim.AdamW."""
    return trainer.configure_optimizer(model, cfg, COURSE)


def train_step(model, optimizer, x, y, grad_clip=1.0):
    """Chapter 04's step (forward, backward, clipping, update) with the course's clipping. Returns the loss tensor."""
    return trainer.train_step(model, optimizer, x, y, grad_clip, COURSE)


def estimate_loss(model, get_batch, eval_iters):
    """Chapter 04's evaluation, under the course's no_grad."""
    return trainer.estimate_loss(model, get_batch, eval_iters, COURSE)


def train(model, get_batch, cfg: TrainConfig, make_optimizer=configure_optimizer, progress=False):
    """Chapter 04's `train` for the course GPT; returns the same history (iter, lr, loss, eval_iter,
    train_loss, val_loss, ms_per_iter). make_optimizer(model, cfg) makes the optimizer (chapter 12's
    payoff passes one whose update is yours)."""
    return trainer.train(model, get_batch, cfg, progress, make_optimizer(model, cfg), COURSE)


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
    runs = (("torch", reference, TORCH, trainer.configure_optimizer), ("course", ours, COURSE, make_optimizer))
    for name, model, lib, make_opt in runs:
        get_batch = make_get_batch(tokens, config.block_size, cfg.batch_size, seed=seed)  # the same batches
        optimizer = make_opt(model, cfg)
        model.train()
        for it in range(steps):
            set_lr(optimizer, lr_at(it, cfg))
            losses[name].append(trainer.train_step(model, optimizer, *get_batch("train"), cfg.grad_clip, lib).item())
        if keep is not None:
            keep[name] = model
    return losses["torch"], losses["course"]
