"""Chapter 04's GPT trained on p processes three ways, with whichever pieces it is given.

Each function runs on every rank of a `launch` and returns the global loss of each step, to be compared
with `problems.train_gpt`, one process on the whole batch. The pieces arrive as arguments (the course's,
or yours as `Code`), so the same loop runs either:

    ring_data_parallel   the simplest data parallelism: after each backward, all the gradients in one flat
                         vector, summed by `ring_all_reduce`, divided by p once
    ddp_zero             `DDP` (buckets sent during backward, two micro-batches per step under `no_sync`)
                         and `ZeroOptimizer` around torch's AdamW: each rank keeps half of AdamW's state
    tensor_parallel      every block's MLP replaced by `ParallelMLP` (its f and g inside): each rank holds
                         1/p of every MLP and sees the whole batch

    runs = launch(train.all_three, 2, steps, pieces)   # pieces: {"ring_all_reduce": ..., "DDP": ..., ...}
"""

import contextlib

import torch
import torch.distributed as dist

from course_lib.distributed.launch import resolve
from course_lib.distributed.problems import ADAMW, GPT_SMALL, gpt_batch, gpt_model, mine, train_adamw


def _equal_slices(rows, parts):
    """The mean of the slices' mean losses is the whole batch's only when the slices are equal."""
    if rows % parts:
        raise ValueError(f"{rows} rows do not split into {parts} equal slices")


def _mean_over_ranks(value, all_reduce):
    total = torch.tensor([value], dtype=torch.float64)
    all_reduce(total)
    return total.item() / dist.get_world_size()


def ring_data_parallel(steps, ring_all_reduce, rows=8, seed=0, config=GPT_SMALL):
    """Same model on every rank (same seed); gradients summed by one ring all-reduce per step."""
    _equal_slices(rows, dist.get_world_size())
    ring = resolve(ring_all_reduce)
    model = gpt_model(seed, config)
    params = list(model.parameters())

    def sum_gradients(loss):
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        ring(flat)
        flat /= dist.get_world_size()
        torch.nn.utils.vector_to_parameters(flat, [p.grad for p in params])   # write the mean back into each .grad
        return _mean_over_ranks(loss.item(), ring)                            # a 1-number tensor: fewer numbers than ranks

    return train_adamw(model, steps, rows, seed, config, rows_of=mine, sync=sum_gradients)


def ddp_zero(steps, DDP, ZeroOptimizer, rows=8, seed=0, config=GPT_SMALL, bucket_bytes=4096, micro=2):
    """Each rank starts from its own seed (DDP's broadcast makes them agree), accumulates `micro` micro-batches
    per step (all but the last under no_sync), and steps with ZeroOptimizer(AdamW)."""
    _equal_slices(rows, dist.get_world_size() * micro)
    model = gpt_model(seed + dist.get_rank(), config)
    ddp = resolve(DDP)(model, bucket_bytes)
    opt = resolve(ZeroOptimizer)(model.parameters(), torch.optim.AdamW, **ADAMW)
    losses = []
    for step in range(steps):
        x, y = gpt_batch(step, rows, config, seed)
        opt.zero_grad()
        total = 0.0
        for k, (xk, yk) in enumerate(zip(mine(x).tensor_split(micro), mine(y).tensor_split(micro))):
            last = k == micro - 1
            with ddp.no_sync() if not last else contextlib.nullcontext():
                _, loss = ddp(xk, yk)
                (loss / micro).backward()
            total += loss.item() / micro
        ddp.finish()
        opt.step()
        losses.append(_mean_over_ranks(total, dist.all_reduce))
    return losses


def tensor_parallel(steps, ParallelMLP, rows=8, seed=0, config=GPT_SMALL, f=None, g=None):
    """Same model on every rank, each block's MLP split; every rank sees the whole batch.

    f, g: Functions for a ParallelMLP that takes them as class attributes (the course's does); one that
    names its own (yours) ignores them."""
    cls = resolve(ParallelMLP)
    if f is not None or g is not None:
        cls = type(cls.__name__, (cls,), {"f": resolve(f) or cls.f, "g": resolve(g) or cls.g})
    model = gpt_model(seed, config)
    for block in model.transformer.h:
        block.mlp = cls(block.mlp)
    return train_adamw(model, steps, rows, seed, config)   # the loss is the same on every rank: g gave each the whole output


def all_three(steps, pieces, rows=8, seed=0, config=GPT_SMALL):
    """The three runs in one launch: {"ring": losses, "ddp + zero": losses, "tensor parallel": losses}."""
    return {"ring": ring_data_parallel(steps, pieces["ring_all_reduce"], rows, seed, config),
            "ddp + zero": ddp_zero(steps, pieces["DDP"], pieces["ZeroOptimizer"], rows, seed, config),
            "tensor parallel": tensor_parallel(steps, pieces["ParallelMLP"], rows, seed, config,
                                               pieces.get("CopyToParallel"), pieces.get("ReduceFromParallel"))}
