"""The training loop: AdamW, warmup plus cosine learning rate (schedule.py), gradient clipping, evaluation.

It trains any model whose forward is `model(idx, targets) -> (logits, loss)` on batches from
any `get_batch(split) -> (x, y)`, so the GPT of this chapter and the Mamba of the next share it.
It names the few things it takes from a tensor library in a `Library` (the optimizer, gradient
clipping, no_grad, how a schedule sets the learning rate): PyTorch's by default; chapter 12 passes the
course's own to train its GPT with this loop, and chapter 13 one whose changing numbers live in tensors,
so that its compiler can capture `train_step` as it is.

    cfg = TrainConfig(max_iters=500, lr=1e-3, lr_decay_iters=500)
    history = train(model, get_batch, cfg)
    plot_curves({"train": history["train_loss"], "val": history["val_loss"]})
"""

import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch

from course_lib.gpt.schedule import lr_at


@dataclass
class TrainConfig:
    max_iters: int = 2000
    batch_size: int = 12           # read by make_get_batch; train() itself takes what get_batch gives
    lr: float = 1e-3               # peak learning rate, reached at the end of warmup
    min_lr: float = 1e-4           # the floor of the cosine
    warmup_iters: int = 100
    lr_decay_iters: int = 2000     # the cosine reaches min_lr here and stays there
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.99)
    grad_clip: float = 1.0         # max global gradient norm; 0 turns clipping off
    eval_interval: int = 250       # evaluate train and val loss every this many steps (and at the end)
    eval_iters: int = 20           # batches averaged per evaluation
    seed: int = 1337


def _torch_adamw(groups, lr, betas):
    """torch.optim.AdamW with `fused=True` where PyTorch has the kernel (floating tensors on CPU or CUDA):
    it updates every parameter in one kernel call per step, where the default runs a dozen small ops
    per parameter tensor. On nanoGPT's CPU configuration the update takes a quarter of the time
    (`benchmarks/ch04_vs_nanogpt.py`)."""
    params = [p for group in groups for p in group["params"]]
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)


def set_lr(optimizer, lr):
    """Give every parameter group the learning rate `lr`, as a schedule does in torch."""
    for group in optimizer.param_groups:
        group["lr"] = lr


@dataclass(frozen=True)
class Library:
    """What the recipe takes from a tensor library. The optimizer it makes has torch's interface:
    `param_groups`, `zero_grad(set_to_none=True)`, `step()`, and its learning rate is whatever `set_lr`
    last gave it (by default, each group's "lr", read at every step)."""

    name: str
    optimizer: Callable                 # optimizer(groups, lr=, betas=) -> an AdamW, or any such optimizer
    clip_grad_norm_: Callable           # (parameters, max_norm) -> the global norm before clipping
    no_grad: Callable                   # a context manager: no graph is recorded inside
    manual_seed: Optional[Callable] = None   # seeds dropout masks at the start of `train`
    to_device: Optional[Callable] = None     # (batch, model) -> the batch where the model's parameters are
    set_lr: Callable = set_lr                # (optimizer, lr): the rate of the next steps


def _to_model_device(batch, model):
    return batch.to(next(model.parameters()).device)


TORCH = Library("torch", _torch_adamw, torch.nn.utils.clip_grad_norm_, torch.no_grad, torch.manual_seed,
                _to_model_device)


def configure_optimizer(model, cfg, lib=TORCH):
    """The library's optimizer (AdamW) decaying only matrices (weights of linear layers, embeddings).

    Biases and LayerNorm gains (ndim < 2) are not decayed: pulling a gain toward 0 only hurts.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return lib.optimizer(groups, lr=cfg.lr, betas=tuple(cfg.betas))


def train_step(model, optimizer, x, y, grad_clip=1.0, lib=TORCH):
    """The course's answer to exercise 04.8 (`train_step`): read it once your check passes.

    One step: forward, backward, clip the global gradient norm, update. Returns the loss tensor
    (reading it, `loss.item()`, is the caller's choice: a compiled step must not read values mid-step)."""
    _, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip:
        lib.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss


def estimate_loss(model, get_batch, eval_iters, lib=TORCH):
    """Mean loss over `eval_iters` batches of each split, in eval mode (no dropout)."""
    was_training = model.training
    model.eval()
    out = {}
    with lib.no_grad():
        for split in ("train", "val"):
            losses = [model(*get_batch(split))[1].item() for _ in range(eval_iters)]
            out[split] = sum(losses) / len(losses)
    model.train(was_training)
    return out


def train(model, get_batch, cfg, progress=True, optimizer=None, lib=TORCH):
    """Train `model` for cfg.max_iters steps and return the history, a dict of lists:

    iter, lr, loss             one entry per step (loss of that step's batch)
    eval_iter, train_loss, val_loss   one entry per evaluation (every eval_interval and at the end)
    and ms_per_iter, the median wall time of a step in milliseconds (evaluations excluded).

    optimizer: configure_optimizer(model, cfg, lib) unless given. lib: the tensor library of `model`.
    """
    from tqdm.auto import tqdm

    if lib.manual_seed is not None:
        lib.manual_seed(cfg.seed)  # dropout masks
    optimizer = optimizer or configure_optimizer(model, cfg, lib)
    history = {"iter": [], "lr": [], "loss": [], "eval_iter": [], "train_loss": [], "val_loss": []}
    step_ms = []

    def evaluate(it):
        losses = estimate_loss(model, get_batch, cfg.eval_iters, lib)
        history["eval_iter"].append(it)
        history["train_loss"].append(losses["train"])
        history["val_loss"].append(losses["val"])

    model.train()
    bar = tqdm(range(cfg.max_iters), disable=not progress, desc="training")
    for it in bar:
        if cfg.eval_interval and it % cfg.eval_interval == 0:
            evaluate(it)
            bar.set_postfix(train=f"{history['train_loss'][-1]:.3f}", val=f"{history['val_loss'][-1]:.3f}")
        t0 = time.perf_counter()  # the whole iteration, as nanoGPT times it: schedule, batch, step
        lr = lr_at(it, cfg)
        lib.set_lr(optimizer, lr)
        x, y = get_batch("train")
        if lib.to_device is not None:
            x, y = lib.to_device(x, model), lib.to_device(y, model)
        loss = train_step(model, optimizer, x, y, cfg.grad_clip, lib).item()
        step_ms.append(1000 * (time.perf_counter() - t0))
        history["iter"].append(it)
        history["lr"].append(lr)
        history["loss"].append(loss)
    evaluate(cfg.max_iters)
    bar.set_postfix(train=f"{history['train_loss'][-1]:.3f}", val=f"{history['val_loss'][-1]:.3f}")
    bar.close()
    history["ms_per_iter"] = sorted(step_ms)[len(step_ms) // 2] if step_ms else float("nan")
    return history


# ---- checkpoints --------------------------------------------------------------------------

def save_checkpoint(path, model, optimizer=None, model_config=None, train_config=None, iter_num=0):
    """Save weights (and optimizer state and configs as plain dicts) with torch.save."""
    torch.save({
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "model_config": asdict(model_config) if model_config is not None else None,
        "train_config": asdict(train_config) if train_config is not None else None,
        "iter_num": iter_num,
    }, path)


def load_checkpoint(path, model=None, optimizer=None):
    """Load a checkpoint with `weights_only=True` (tensors and plain containers only, no code runs).

    Loads the weights into `model` and the state into `optimizer` when given; returns the dict.
    """
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if model is not None:
        model.load_state_dict(ckpt["model"])
    if optimizer is not None and ckpt["optimizer"] is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
    return ckpt
