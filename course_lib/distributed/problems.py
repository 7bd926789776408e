"""Seeded problems for the workers, and the one-process runs they are compared with (the oracles).

Inputs are drawn from seeds, not passed in, so the parent can draw the same global batch and train
the same model in one process:

    per_rank = launch(train.ddp_zero, 2, steps=5, ...)    # every rank trains on its slice of each batch
    reference = problems.train_gpt(5)                      # one process, the whole batch: the same losses

The GPT task is counting: windows of k, k+1, k+2, ... (mod the vocabulary) from random starts, which a
two-layer GPT learns in a few dozen steps, so a loss curve shows learning within a test's budget.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from course_lib.gpt.model import GPT, GPTConfig


def mine(t):
    """This rank's equal slice of a global batch (rows): the data-parallel split."""
    return t.tensor_split(dist.get_world_size())[dist.get_rank()]


# ---- a toy regression ---------------------------------------------------------------------------

def toy_model(seed=0):
    """A small float64 MLP with odd sizes (161 parameters, four tensors)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 13), nn.Tanh(), nn.Linear(13, 5)).double()


def toy_batch(step, rows, seed=0):
    g = torch.Generator().manual_seed(seed * 1_000 + step)
    return torch.randn(rows, 6, generator=g, dtype=torch.float64), torch.randn(rows, 5, generator=g, dtype=torch.float64)


def train_toy(steps, rows=6, seed=0, optimizer="sgd"):
    """The oracle: the toy model trained in one process on the global batch; its final parameters."""
    model = toy_model(seed)
    opt = toy_optimizer(model.parameters(), optimizer)
    for step in range(steps):
        x, y = toy_batch(step, rows, seed)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def toy_optimizer(params, kind):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=0.05, weight_decay=0.1)


# ---- chapter 04's GPT on a counting task ----------------------------------------------------------

GPT_SMALL = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
ADAMW = dict(lr=1e-2, weight_decay=0.1)


def gpt_model(seed=0, config=GPT_SMALL):
    """Chapter 04's GPT in float64, initialized from `seed`."""
    torch.manual_seed(seed)
    return GPT(GPTConfig(**config)).double()


def gpt_batch(step, rows, config=GPT_SMALL, seed=0):
    """Windows of counting sequences (k, k+1, ... mod vocab) from random starts: something quick to learn."""
    config = GPTConfig(**config) if isinstance(config, dict) else config
    g = torch.Generator().manual_seed(seed * 1_000 + step)
    starts = torch.randint(config.vocab_size, (rows, 1), generator=g)
    ids = (starts + torch.arange(config.block_size + 1)) % config.vocab_size
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def train_adamw(model, steps, rows=8, seed=0, config=GPT_SMALL, rows_of=None, sync=None):
    """Train a GPT `model` with AdamW on the counting task's batches; the loss of each step.

    rows_of(t): the rows of each batch this process trains on (default: all of them).
    sync(loss): what runs between backward and the optimizer's step (a data-parallel sum of the gradients);
    it returns the step's loss as a number (default: loss.item())."""
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    for step in range(steps):
        x, y = gpt_batch(step, rows, config, seed)
        if rows_of is not None:
            x, y = rows_of(x), rows_of(y)
        opt.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        losses.append(sync(loss) if sync is not None else loss.item())
        opt.step()
    return losses


def train_gpt(steps, rows=8, seed=0, config=GPT_SMALL):
    """The oracle: the GPT trained in one process on the global batch with AdamW; the loss of each step."""
    return train_adamw(gpt_model(seed, config), steps, rows, seed, config)
