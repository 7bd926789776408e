"""What the workers run, and the single-process references they are compared with.

Each worker function runs on every rank of a `launch` and returns something small (tensors are
copied back to the parent). Inputs are drawn from seeds, not passed in, so the parent can draw the
same global batch and train the same model in one process: that is the oracle.

    from course_lib.distributed import launch, workers
    per_rank = launch(workers.ddp_matches, 2, 3)     # [rank 0's result, rank 1's result]
    reference = workers.train_toy(3)

The implementation under test can be swapped for another (a class, or a `Code` for a notebook's own),
so the same worker shows that a wrong implementation gives other numbers.
"""

import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from course_lib.distributed.collectives import ring_all_reduce
from course_lib.distributed.ddp import DDP
from course_lib.distributed.launch import device, resolve
from course_lib.distributed.tensor_parallel import ColumnParallelLinear, ParallelMLP, RowParallelLinear
from course_lib.distributed.zero import ZeroAdamW
from course_lib.gpt.model import GPT, MLP, GPTConfig


def run_all(cases):
    """Several workers in one launch (each launch costs seconds of process start): [(fn, kwargs)] -> results."""
    return [resolve(fn)(**kwargs) for fn, kwargs in cases]


def mine(t):
    """This rank's equal slice of a global batch (rows)."""
    return t.tensor_split(dist.get_world_size())[dist.get_rank()]


# ---- the ring ---------------------------------------------------------------------------------

def ring_input(n, rank, seed=0):
    """Rank `rank`'s random float64 vector of length n (the parent draws the same ones to sum them)."""
    return torch.randn(n, generator=torch.Generator().manual_seed(seed * 100_003 + n * 17 + rank), dtype=torch.float64)


def ring_matches_all_reduce(lengths, seed=0, ring=None):
    """[(ring all-reduce, dist.all_reduce)] of each rank's random ring_input(n), for each length n."""
    ring = resolve(ring) or ring_all_reduce
    out = []
    for n in lengths:
        x = ring_input(n, dist.get_rank(), seed).to(device())
        a, b = x.clone(), x.clone()
        ring(a)
        dist.all_reduce(b)
        out.append((a.cpu(), b.cpu()))
    return out


def time_all_reduce(lengths, repeats=20, dtype=torch.float32):
    """Median seconds of ring_all_reduce and of dist.all_reduce for tensors of each length, interleaved."""
    out = []
    for n in lengths:
        x = torch.randn(n, dtype=dtype, device=device())
        times = {"ring": [], "all_reduce": []}
        for _ in range(repeats):
            for name, fn in (("ring", ring_all_reduce), ("all_reduce", dist.all_reduce)):
                dist.barrier()
                t0 = time.perf_counter()
                fn(x)
                if x.is_cuda:
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - t0)
                x.div_(dist.get_world_size())   # keep the values from growing
        out.append({"n": n, "bytes": n * x.element_size(), **{k: sorted(v)[len(v) // 2] for k, v in times.items()}})
    return out


# ---- data parallelism on a toy model ------------------------------------------------------------

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
    opt = _toy_optimizer(model.parameters(), optimizer)
    for step in range(steps):
        x, y = toy_batch(step, rows, seed)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _toy_optimizer(params, kind):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=0.05, weight_decay=0.1)


def train_toy_parallel(model, wrapped, opt, steps, rows, seed, finish=lambda: None):
    """`steps` steps of the toy regression on this rank's share of each global batch; returns the parameters.

    wrapped: what runs the forward (the model itself, or a DDP wrapper); finish: called after each backward
    (a from-scratch DDP waits for its last buckets there)."""
    for step in range(steps):
        x, y = (t.to(device()) for t in toy_batch(step, rows, seed))
        opt.zero_grad()
        F.mse_loss(wrapped(mine(x)), mine(y)).backward()
        finish()
        opt.step()
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def ddp_matches(steps, rows=6, seed=0, bucket_sizes=(0, 200, 2**20), ddp_class=None, with_torch=True):
    """Train the toy model with our DDP at each bucket size (and with torch's DDP).

    Returns {"params": {bucket size or "torch": final parameters}, "in flight": {bucket size: (buckets
    already sent when the first layer's weight got its gradient, sent when backward returned, buckets)}}:
    the first number shows communication starting while backward still runs.
    Every rank starts from a different initialization, so only the broadcast makes them agree.
    """
    cls = resolve(ddp_class) or DDP
    out = {"params": {}, "in flight": {}}
    for bucket_bytes in bucket_sizes:
        model = toy_model(seed + dist.get_rank()).to(device())
        seen, box = [], []   # model[0].weight's gradient is among the last; this hook runs before DDP's own
        model[0].weight.register_post_accumulate_grad_hook(lambda p: seen.append(len(box[0].inflight)))
        ddp = cls(model, bucket_bytes)
        box.append(ddp)

        def finish():
            seen.append(len(ddp.inflight))
            ddp.finish()

        opt = _toy_optimizer(model.parameters(), "sgd")
        out["params"][bucket_bytes] = train_toy_parallel(model, ddp, opt, steps, rows, seed, finish)
        out["in flight"][bucket_bytes] = (seen[0], seen[1], len(ddp.buckets))
    if with_torch:
        model = toy_model(seed + dist.get_rank()).to(device())
        theirs = DistributedDataParallel(model)   # it broadcasts from rank 0 too
        opt = _toy_optimizer(model.parameters(), "sgd")
        out["params"]["torch"] = train_toy_parallel(model, theirs, opt, steps, rows, seed)
    return out


def zero_matches(steps, rows=6, seed=0, zero_class=None):
    """Train the toy model with DDP and ZeRO-1 AdamW: (final parameters, optimizer state bytes on this rank)."""
    model = toy_model(seed).to(device())
    ddp = DDP(model)
    opt = (resolve(zero_class) or ZeroAdamW)(model.parameters(), lr=0.05, weight_decay=0.1)
    return train_toy_parallel(model, ddp, opt, steps, rows, seed, ddp.finish), opt.state_bytes()


# ---- tensor parallelism --------------------------------------------------------------------------

def tp_input(n_embd=12, batch=3, seq=5, seed=0):
    """The GPT MLP (same weights on every rank), an input x and a weighting of the output for the loss."""
    torch.manual_seed(seed)
    mlp = MLP(GPTConfig(n_embd=n_embd)).double()
    x = torch.randn(batch, seq, n_embd, dtype=torch.float64)
    w = torch.randn(batch, seq, n_embd, dtype=torch.float64)
    return mlp, x, w


def tp_mlp_matches(n_embd=12, seed=0, column=None, row=None):
    """The tensor-parallel MLP's output, x's gradient, and its parameters' gradients with their slices."""
    mlp, x, w = (t.to(device()) for t in tp_input(n_embd, seed=seed))
    tp = ParallelMLP(mlp, resolve(column) or ColumnParallelLinear, resolve(row) or RowParallelLinear)
    x.requires_grad_(True)
    out = tp(x)
    (out * w).sum().backward()
    return {"out": out.detach().cpu(), "x.grad": x.grad.cpu(),
            "c_fc": (tp.c_fc.lo, tp.c_fc.hi, tp.c_fc.weight.grad.cpu(), tp.c_fc.bias.grad.cpu()),
            "c_proj": (tp.c_proj.lo, tp.c_proj.hi, tp.c_proj.weight.grad.cpu(), tp.c_proj.bias.grad.cpu())}


# ---- the chapter 04 GPT, data-parallel ------------------------------------------------------------

GPT_SMALL = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, dropout=0.0)


def gpt_batch(step, rows, config, seed=0):
    """Windows of counting sequences (k, k+1, ... mod vocab) from random starts: something quick to learn."""
    g = torch.Generator().manual_seed(seed * 1_000 + step)
    starts = torch.randint(config.vocab_size, (rows, 1), generator=g)
    ids = (starts + torch.arange(config.block_size + 1)) % config.vocab_size
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def train_gpt(steps, rows=4, seed=0, config=GPT_SMALL):
    """The oracle: chapter 04's GPT in float64 trained in one process on the global batch; its losses."""
    torch.manual_seed(seed)
    config = GPTConfig(**config)
    model = GPT(config).double()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for step in range(steps):
        x, y = gpt_batch(step, rows, config, seed)
        opt.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def gpt_data_parallel(steps, rows=4, seed=0, config=GPT_SMALL, zero=False, bucket_bytes=4096):
    """The same GPT trained with our DDP (and AdamW, or ZeRO-1 AdamW): the global loss of each step."""
    torch.manual_seed(seed)
    config = GPTConfig(**config)
    model = GPT(config).double().to(device())
    ddp = DDP(model, bucket_bytes)
    opt = (ZeroAdamW if zero else torch.optim.AdamW)(model.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for step in range(steps):
        x, y = (t.to(device()) for t in gpt_batch(step, rows, config, seed))
        opt.zero_grad()
        _, loss = ddp(mine(x), mine(y))
        loss.backward()
        ddp.finish()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)   # the global batch's loss: the mean of equal slices' means
        losses.append(total.item() / dist.get_world_size())
    return losses


def ddp_step_times(bucket_sizes, steps=12, rows=8, config=None, seed=0):
    """Median seconds per training step of a GPT under our DDP, by bucket size, and under torch's DDP ("torch DDP").

    The variants take turns step by step, so the machine's load falls on all of them alike.
    """
    config = GPTConfig(**(config or dict(vocab_size=96, block_size=64, n_layer=4, n_head=4, n_embd=128)))
    variants = {}
    for b in bucket_sizes:
        torch.manual_seed(seed)
        model = GPT(config).to(device())
        ddp = DDP(model, b)
        variants[b] = (ddp, torch.optim.AdamW(model.parameters()), ddp.finish)
    torch.manual_seed(seed)
    model = GPT(config).to(device())
    theirs = DistributedDataParallel(model, bucket_cap_mb=max(bucket_sizes) / 2**20)
    variants["torch DDP"] = (theirs, torch.optim.AdamW(model.parameters()), lambda: None)
    times = {name: [] for name in variants}
    for step in range(steps):
        x, y = (t.to(device()) for t in gpt_batch(step, rows, config, seed))
        for name, (wrapped, opt, finish) in variants.items():
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            _, loss = wrapped(mine(x), mine(y))
            loss.backward()
            finish()
            opt.step()
            if x.is_cuda:
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
    return {name: sorted(ts[2:])[len(ts[2:]) // 2] for name, ts in times.items()}


def optimizer_state_bytes(config=None, seed=0):
    """(ZeroAdamW's state bytes on this rank, torch AdamW's) for a float32 GPT after one step."""
    config = GPTConfig(**(config or dict(vocab_size=96, block_size=64, n_layer=4, n_head=4, n_embd=128)))
    torch.manual_seed(seed)
    model = GPT(config)
    x, y = gpt_batch(0, 2, config, seed)
    model(x, y)[1].backward()
    ours, theirs = ZeroAdamW(model.parameters()), torch.optim.AdamW(model.parameters())
    ours.step()
    theirs.step()
    full = sum(t.numel() * t.element_size() for s in theirs.state.values() for t in s.values() if t.numel() > 1)
    return ours.state_bytes(), full


# ---- failures, for the supervisor ---------------------------------------------------------------

def fail_at_step(victim, at_step, how="kill", steps=6):
    """All ranks all-reduce in a loop; at `at_step`, rank `victim` is killed (SIGKILL), raises, or hangs."""
    x = torch.randn(4, dtype=torch.float64)
    for step in range(steps):
        if dist.get_rank() == victim and step == at_step:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "hang":
                time.sleep(3600)   # the others wait in their all-reduce until its timeout
            raise ValueError(f"rank {victim} gives up at step {step}")
        dist.all_reduce(x)
    return x
