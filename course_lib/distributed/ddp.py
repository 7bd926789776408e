"""Data parallelism from scratch: every rank holds the whole model and a slice of the batch.

This file is the course's answer to exercise 11.2: read it once your check passes.

    model = DDP(net, bucket_bytes=2**20)
    loss = loss_fn(model(x_mine), y_mine); loss.backward()
    model.finish()          # wait for the gradient all-reduces, average
    opt.step()

The ranks stay identical if they start identical (rank 0 broadcasts its parameters) and apply the
same update, which holds if every rank steps with the gradient of the global batch. With equal local
batches and a mean loss, that gradient is the mean of the local ones: sum them (all-reduce), divide
by the world size once (dividing in two places halves it again, a silent learning-rate change).

Why hooks and buckets: waiting for the whole backward before communicating leaves the network idle
during the backward and the processor idle during the all-reduce. A parameter's gradient is final as
soon as autograd has accumulated it (`register_post_accumulate_grad_hook`), and the last layers'
gradients come first, so the all-reduce of those can run while autograd still works on the first
layers. One all-reduce per parameter would pay the ring's latency hundreds of times; a bucket groups
parameters, in reverse order, until it holds `bucket_bytes`, and goes out, asynchronously, as soon as
its last gradient lands. Buckets go out in a fixed order on every rank (collectives must match one to
one), so a bucket that fills before the one ahead of it waits for it.

Gradient accumulation: backward passes inside `with model.no_sync():` send nothing; their gradients
add up in `.grad`, and the next backward outside it sends the sums.
"""

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn


def broadcast_parameters(module, src=0):
    """The course's answer to exercise 11.2 (`ddp`): read it once your check passes.

    Copy rank `src`'s parameters and buffers to every rank, so all start from the same point."""
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t, src)


def make_buckets(params, bucket_bytes):
    """The course's answer to exercise 11.2 (`ddp`): read it once your check passes.

    Group params, in the given order, into lists that close once they hold at least bucket_bytes."""
    buckets, current, size = [], [], 0
    for p in params:
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


class DDP(nn.Module):
    """The course's answer to exercise 11.2 (`ddp`): read it once your check passes.

    Wrap `module`: broadcast it from rank 0, all-reduce its gradients in buckets during backward."""

    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        broadcast_parameters(module)
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = make_buckets(params[::-1], bucket_bytes)   # reversed: the order backward produces them
        self.bucket_of = {p: i for i, bucket in enumerate(self.buckets) for p in bucket}
        for p in params:
            p.register_post_accumulate_grad_hook(self._grad_ready)
        self.syncing = True
        self._reset()

    def _reset(self):
        self.arrived = [0] * len(self.buckets)   # gradients landed in each bucket during this backward
        self.inflight = []                       # (bucket index, flat gradients, async work), in launch order

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes in here only accumulate gradients; the first one after it sends their sums."""
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True

    def _grad_ready(self, p):
        if not self.syncing:
            return
        self.arrived[self.bucket_of[p]] += 1
        while len(self.inflight) < len(self.buckets) and self._ready(len(self.inflight)):
            self._launch(len(self.inflight))

    def _ready(self, i):
        """Bucket i may go: every one of its gradients has landed."""
        return self.arrived[i] == len(self.buckets[i])

    def _launch(self, i):
        """Flatten bucket i's gradients into one tensor and start its all-reduce without waiting."""
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.buckets[i]])
        self.inflight.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def finish(self):
        """Before the optimizer step: wait for every bucket, average once, write the gradients back."""
        while len(self.inflight) < len(self.buckets):   # buckets whose parameters got no gradient this time
            self._launch(len(self.inflight))
        for i, flat, work in self.inflight:
            work.wait()
            flat /= self.world_size
            offset = 0
            for p in self.buckets[i]:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self._reset()
