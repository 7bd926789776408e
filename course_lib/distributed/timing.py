"""What the benchmarks and the lesson measure, on every rank of a `launch`: times, and optimizer state.

Contestants take turns (one call each, then again), after a barrier, so a busy machine slows them alike;
each figure is the median of its repeats. On a machine with fewer cores than ranks the ranks share cores,
and the figures measure that sharing as much as the algorithms: compare ratios, not absolute times.
The pieces to time (a DDP class, a ZeRO-1 class) are arguments: this file holds none of them.
"""

import contextlib
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook

from course_lib.distributed.launch import device, resolve
from course_lib.distributed.problems import gpt_batch, mine
from course_lib.gpt.model import GPT, GPTConfig

NANO_CPU = dict(vocab_size=96, block_size=64, n_layer=4, n_head=4, n_embd=128)   # nanoGPT's CPU shape


def _median(times, skip=0):
    times = sorted(times[skip:])
    return times[len(times) // 2]


def _sync(x):
    if x.is_cuda:
        torch.cuda.synchronize()


def time_collectives(fns, lengths, repeats=20, dtype=torch.float32):
    """Median seconds of each in-place sum fns[name](tensor) on float tensors of each length.

    fns: {name: function or Code}. Returns [{"n", "bytes", name: seconds, ...}] for each length."""
    fns = {name: resolve(fn) for name, fn in fns.items()}
    out = []
    for n in lengths:
        x = torch.randn(n, dtype=dtype, device=device())
        times = {name: [] for name in fns}
        for _ in range(repeats):
            for name, fn in fns.items():
                dist.barrier()
                t0 = time.perf_counter()
                fn(x)
                _sync(x)
                times[name].append(time.perf_counter() - t0)
                x.div_(dist.get_world_size())   # keep the values from growing
        out.append({"n": n, "bytes": n * x.element_size(), **{k: _median(v) for k, v in times.items()}})
    return out


def ddp_step_times(ddp_class, bucket_sizes, steps=12, rows=8, config=None, seed=0):
    """Median seconds per training step of a GPT under `ddp_class` (a DDP), by bucket size, and under torch's
    DistributedDataParallel ("torch DDP")."""
    cls = resolve(ddp_class)
    config = GPTConfig(**(config or NANO_CPU))
    variants = {}
    for b in bucket_sizes:
        torch.manual_seed(seed)
        model = GPT(config).to(device())
        ddp = cls(model, b)
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
            _sync(x)
            times[name].append(time.perf_counter() - t0)
    return {name: _median(ts, skip=2) for name, ts in times.items()}


@contextlib.contextmanager
def optimizers_stepped():
    """The torch optimizers that step inside the block, however deeply a wrapper keeps them (an optimizer makes
    its state when it first steps), through torch's global step hook: yields the list they are appended to."""
    stepped = []

    def record(optimizer, args, kwargs):
        if not any(o is optimizer for o in stepped):
            stepped.append(optimizer)

    handle = register_optimizer_step_post_hook(record)
    try:
        yield stepped
    finally:
        handle.remove()


def state_numbers(optimizers):
    """How many numbers the optimizers keep in state tensors (step counters, 0-dimensional, left out), each
    tensor counted once."""
    held = {id(t): t.numel() for opt in optimizers for s in opt.state.values() for t in s.values()
            if torch.is_tensor(t) and t.dim() > 0}
    return sum(held.values())


def optimizer_state_bytes(zero_class, config=None, seed=0):
    """(bytes of AdamW state this rank keeps under `zero_class` (a ZeRO-1 wrapper), bytes of torch AdamW's) for a
    float32 GPT."""
    config = GPTConfig(**(config or NANO_CPU))
    torch.manual_seed(seed)
    model = GPT(config)
    x, y = gpt_batch(0, 2, config, seed)
    model(x, y)[1].backward()
    with optimizers_stepped() as ours:
        resolve(zero_class)(model.parameters(), torch.optim.AdamW).step()
    theirs = torch.optim.AdamW(model.parameters())
    theirs.step()
    return 4 * state_numbers(ours), 4 * state_numbers([theirs])
