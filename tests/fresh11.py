"""Chapter 11: fresh answers (scratch for the audit)."""

import contextlib
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from course_lib.checks import CheckFailed
from course_lib.checks import ch11 as check


@pytest.fixture(autouse=True)
def _isolated(workspace):
    """A passing check saves the answer: keep it in a temporary workspace."""


# ---------------------------------------------------------------- 1. ring all-reduce

def ring_shifted_start(tensor):
    """Correct, another schedule: every rank starts two chunks further on; both messages posted at once."""
    rank, p = dist.get_rank(), dist.get_world_size()
    parts = torch.tensor_split(tensor.view(-1), p)
    right, left = (rank + 1) % p, (rank - 1) % p
    for step in range(p - 1):                       # reduce-scatter
        give, take = parts[(rank + 2 - step) % p], parts[(rank + 1 - step) % p]
        inbox = torch.empty_like(take)
        works = [dist.isend(give, right), dist.irecv(inbox, left)]
        for w in works:
            w.wait()
        take += inbox
    for step in range(p - 1):                       # all-gather, from the chunk this rank finished
        give, take = parts[(rank + 3 - step) % p], parts[(rank + 2 - step) % p]
        inbox = torch.empty_like(take)
        works = [dist.isend(give, right), dist.irecv(inbox, left)]
        for w in works:
            w.wait()
        take.copy_(inbox)
    return tensor


def ring_whole_tensor(tensor):
    """Right sums, by neighbours only, but the whole tensor travels at every step: p - 1 messages of n numbers."""
    rank, p = dist.get_rank(), dist.get_world_size()
    passing = tensor.clone()
    total = tensor.clone()
    for _ in range(p - 1):
        inbox = torch.empty_like(passing)
        send = dist.isend(passing, (rank + 1) % p)
        dist.recv(inbox, (rank - 1) % p)
        send.wait()
        total += inbox
        passing = inbox
    tensor.copy_(total)
    return tensor


def ring_collective(tensor):
    """Right sums, no ring: the library's all-reduce."""
    dist.all_reduce(tensor)
    return tensor


def ring_gather_adds(tensor):
    """Wrong: the all-gather adds what arrives instead of overwriting."""
    me, size = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor.view(-1), size)
    for phase in range(2):
        for s in range(size - 1):
            outgoing = chunks[(me - s + phase) % size]
            target = chunks[(me - s - 1 + phase) % size]
            buf = torch.empty_like(target)
            sending = dist.isend(outgoing, dst=(me + 1) % size)
            dist.recv(buf, src=(me - 1) % size)
            sending.wait()
            target.add_(buf)
    return tensor


def ring_on_a_copy(tensor):
    """Wrong: cuts a flattened copy (reshape of a contiguous tensor is a view, so clone makes the copy)."""
    me, size = dist.get_rank(), dist.get_world_size()
    work = tensor.clone().view(-1)
    chunks = torch.tensor_split(work, size)
    for phase in range(2):
        for s in range(size - 1):
            outgoing = chunks[(me - s + phase) % size]
            target = chunks[(me - s - 1 + phase) % size]
            buf = torch.empty_like(target)
            sending = dist.isend(outgoing, dst=(me + 1) % size)
            dist.recv(buf, src=(me - 1) % size)
            sending.wait()
            if phase == 0:
                target.add_(buf)
            else:
                target.copy_(buf)
    return work.view_as(tensor)


# ---------------------------------------------------------------- 2. DDP

class DDPCounters(nn.Module):
    """Correct, written differently: a countdown per bucket, a cursor for the next bucket to send, hooks as
    closures, nested no_sync, the mean taken per parameter."""

    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for p in self.module.parameters():
                dist.broadcast(p.data, 0)
        trainable = [p for p in self.module.parameters() if p.requires_grad]
        self.buckets = [[]]
        size = 0
        for p in reversed(trainable):
            if size >= bucket_bytes and self.buckets[-1]:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * p.element_size()
        self.bucket_of = {}
        for b, members in enumerate(self.buckets):
            for p in members:
                self.bucket_of[p] = b
        self.silent = 0
        self.reset()
        for p in trainable:
            p.register_post_accumulate_grad_hook(lambda param: self.landed(param))

    def reset(self):
        self.missing = [len(b) for b in self.buckets]
        self.cursor = 0
        self.inflight = []

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def landed(self, param):
        if self.silent:
            return
        self.missing[self.bucket_of[param]] -= 1
        while self.cursor < len(self.buckets) and self.missing[self.cursor] == 0:
            members = self.buckets[self.cursor]
            flat = torch.cat([p.grad.flatten() for p in members])
            self.inflight.append((members, flat, dist.all_reduce(flat, async_op=True)))
            self.cursor += 1

    def finish(self):
        p_count = dist.get_world_size()
        for members, flat, work in self.inflight:
            work.wait()
            at = 0
            for p in members:
                p.grad.copy_(flat[at:at + p.numel()].view_as(p.grad) / p_count)
                at += p.numel()
        self.reset()

    @contextlib.contextmanager
    def no_sync(self):
        self.silent += 1
        try:
            yield
        finally:
            self.silent -= 1


class DDPSendInFinish(nn.Module):
    """Right numbers; every bucket is sent by finish(), after the backward: no overlap."""

    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for t in module.parameters():
                dist.broadcast(t, src=0)
        self.groups, group, nbytes = [], [], 0
        for t in reversed(list(module.parameters())):
            group.append(t)
            nbytes += t.numel() * t.element_size()
            if nbytes >= bucket_bytes:
                self.groups.append(group)
                group, nbytes = [], 0
        if group:
            self.groups.append(group)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def landed(self, param):
        pass

    def finish(self):
        works = []
        for g in self.groups:
            flat = torch.cat([t.grad.reshape(-1) for t in g])
            works.append((g, flat, dist.all_reduce(flat, async_op=True)))
        for g, flat, w in works:
            w.wait()
            flat /= dist.get_world_size()
            for t, part in zip(g, flat.split([t.numel() for t in g])):
                t.grad.copy_(part.view_as(t))

    @contextlib.contextmanager
    def no_sync(self):
        yield


class DDPOnePerLanding(nn.Module):
    """Right numbers; a landing gradient releases at most one bucket (`if`, not `while`); what is left goes
    in finish()."""

    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for t in module.parameters():
                dist.broadcast(t, src=0)
        self.groups, group, nbytes = [], [], 0
        for t in reversed(list(module.parameters())):
            group.append(t)
            nbytes += t.numel() * t.element_size()
            if nbytes >= bucket_bytes:
                self.groups.append(group)
                group, nbytes = [], 0
        if group:
            self.groups.append(group)
        self.home = {t: k for k, g in enumerate(self.groups) for t in g}
        for t in module.parameters():
            t.register_post_accumulate_grad_hook(self.landed)
        self.quiet = False
        self.counts, self.pending = [0] * len(self.groups), []

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def send(self, k):
        flat = torch.cat([t.grad.reshape(-1) for t in self.groups[k]])
        self.pending.append((k, flat, dist.all_reduce(flat, async_op=True)))

    def landed(self, param):
        if self.quiet:
            return
        self.counts[self.home[param]] += 1
        k = len(self.pending)
        if k < len(self.groups) and self.counts[k] == len(self.groups[k]):
            self.send(k)

    def finish(self):
        while len(self.pending) < len(self.groups):
            self.send(len(self.pending))
        for k, flat, work in self.pending:
            work.wait()
            flat /= dist.get_world_size()
            for t, mean in zip(self.groups[k], flat.split([t.numel() for t in self.groups[k]])):
                t.grad.copy_(mean.view_as(t))
        self.counts, self.pending = [0] * len(self.groups), []

    @contextlib.contextmanager
    def no_sync(self):
        self.quiet = True
        try:
            yield
        finally:
            self.quiet = False


class DDPStrictlyAbove(nn.Module):
    """Right numbers; a bucket closes only strictly above bucket_bytes."""

    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for t in module.parameters():
                dist.broadcast(t, src=0)
        self.groups, group, nbytes = [], [], 0
        for t in reversed(list(module.parameters())):
            group.append(t)
            nbytes += t.numel() * t.element_size()
            if nbytes > bucket_bytes:
                self.groups.append(group)
                group, nbytes = [], 0
        if group:
            self.groups.append(group)
        self.home = {t: k for k, g in enumerate(self.groups) for t in g}
        for t in module.parameters():
            t.register_post_accumulate_grad_hook(self.landed)
        self.quiet = False
        self.counts, self.pending = [0] * len(self.groups), []

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def landed(self, param):
        if self.quiet:
            return
        self.counts[self.home[param]] += 1
        k = len(self.pending)
        while k < len(self.groups) and self.counts[k] == len(self.groups[k]):
            flat = torch.cat([t.grad.reshape(-1) for t in self.groups[k]])
            self.pending.append((k, flat, dist.all_reduce(flat, async_op=True)))
            k += 1

    def finish(self):
        for k, flat, work in self.pending:
            work.wait()
            flat /= dist.get_world_size()
            for t, mean in zip(self.groups[k], flat.split([t.numel() for t in self.groups[k]])):
                t.grad.copy_(mean.view_as(t))
        self.counts, self.pending = [0] * len(self.groups), []

    @contextlib.contextmanager
    def no_sync(self):
        self.quiet = True
        try:
            yield
        finally:
            self.quiet = False


class DDPCompletionOrder(nn.Module):
    """Sends each bucket the moment it is complete, whatever the buckets ahead of it did."""

    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for t in module.parameters():
                dist.broadcast(t, src=0)
        self.groups, group, nbytes = [], [], 0
        for t in reversed(list(module.parameters())):
            group.append(t)
            nbytes += t.numel() * t.element_size()
            if nbytes >= bucket_bytes:
                self.groups.append(group)
                group, nbytes = [], 0
        if group:
            self.groups.append(group)
        self.home = {t: k for k, g in enumerate(self.groups) for t in g}
        for t in module.parameters():
            t.register_post_accumulate_grad_hook(self.landed)
        self.quiet = False
        self.counts, self.pending = [0] * len(self.groups), []

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def landed(self, param):
        if self.quiet:
            return
        k = self.home[param]
        self.counts[k] += 1
        if self.counts[k] == len(self.groups[k]):
            flat = torch.cat([t.grad.reshape(-1) for t in self.groups[k]])
            self.pending.append((k, flat, dist.all_reduce(flat, async_op=True)))

    def finish(self):
        for k, flat, work in self.pending:
            work.wait()
            flat /= dist.get_world_size()
            for t, mean in zip(self.groups[k], flat.split([t.numel() for t in self.groups[k]])):
                t.grad.copy_(mean.view_as(t))
        self.counts, self.pending = [0] * len(self.groups), []

    @contextlib.contextmanager
    def no_sync(self):
        self.quiet = True
        try:
            yield
        finally:
            self.quiet = False


class DDPNoSyncStillCounts(nn.Module):
    """Wrong: under no_sync the hooks still count (only the sending is skipped), so the counts run ahead."""

    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for t in module.parameters():
                dist.broadcast(t, src=0)
        self.groups, group, nbytes = [], [], 0
        for t in reversed(list(module.parameters())):
            group.append(t)
            nbytes += t.numel() * t.element_size()
            if nbytes >= bucket_bytes:
                self.groups.append(group)
                group, nbytes = [], 0
        if group:
            self.groups.append(group)
        self.home = {t: k for k, g in enumerate(self.groups) for t in g}
        for t in module.parameters():
            t.register_post_accumulate_grad_hook(self.landed)
        self.quiet = False
        self.counts, self.pending = [0] * len(self.groups), []

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def landed(self, param):
        self.counts[self.home[param]] += 1
        if self.quiet:
            return
        k = len(self.pending)
        while k < len(self.groups) and self.counts[k] >= len(self.groups[k]):
            flat = torch.cat([t.grad.reshape(-1) for t in self.groups[k]])
            self.pending.append((k, flat, dist.all_reduce(flat, async_op=True)))
            k += 1

    def finish(self):
        for k, flat, work in self.pending:
            work.wait()
            flat /= dist.get_world_size()
            for t, mean in zip(self.groups[k], flat.split([t.numel() for t in self.groups[k]])):
                t.grad.copy_(mean.view_as(t))
        self.counts, self.pending = [0] * len(self.groups), []

    @contextlib.contextmanager
    def no_sync(self):
        self.quiet = True
        try:
            yield
        finally:
            self.quiet = False


class DDPNoBroadcast(nn.Module):
    """Wrong: never copies rank 0's parameters."""

    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module = module
        self.groups, group, nbytes = [], [], 0
        for t in reversed(list(module.parameters())):
            group.append(t)
            nbytes += t.numel() * t.element_size()
            if nbytes >= bucket_bytes:
                self.groups.append(group)
                group, nbytes = [], 0
        if group:
            self.groups.append(group)
        self.home = {t: k for k, g in enumerate(self.groups) for t in g}
        for t in module.parameters():
            t.register_post_accumulate_grad_hook(self.landed)
        self.quiet = False
        self.counts, self.pending = [0] * len(self.groups), []

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def landed(self, param):
        if self.quiet:
            return
        self.counts[self.home[param]] += 1
        k = len(self.pending)
        while k < len(self.groups) and self.counts[k] == len(self.groups[k]):
            flat = torch.cat([t.grad.reshape(-1) for t in self.groups[k]])
            self.pending.append((k, flat, dist.all_reduce(flat, async_op=True)))
            k += 1

    def finish(self):
        for k, flat, work in self.pending:
            work.wait()
            flat /= dist.get_world_size()
            for t, mean in zip(self.groups[k], flat.split([t.numel() for t in self.groups[k]])):
                t.grad.copy_(mean.view_as(t))
        self.counts, self.pending = [0] * len(self.groups), []

    @contextlib.contextmanager
    def no_sync(self):
        self.quiet = True
        try:
            yield
        finally:
            self.quiet = False


# ---------------------------------------------------------------- 3. ZeRO-1

class ZeroWholeTensors:
    """Correct, another sharding: whole tensors dealt out, each to the least-loaded rank; the owner steps its
    tensors in place with an optimizer of its own, then broadcasts each one."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = [t for t in params if t.requires_grad]
        load = [0] * dist.get_world_size()
        self.owner = []
        for t in self.params:
            r = min(range(len(load)), key=lambda j: (load[j], j))
            self.owner.append(r)
            load[r] += t.numel()
        mine = [t for t, r in zip(self.params, self.owner) if r == dist.get_rank()]
        self.optimizer = optimizer_class(mine, **defaults) if mine else None

    def zero_grad(self):
        for t in self.params:
            t.grad = None

    @torch.no_grad()
    def step(self):
        if self.optimizer is not None:
            self.optimizer.step()
        for t, r in zip(self.params, self.owner):
            dist.broadcast(t, src=r)


class ZeroSplitEvenly:
    """Correct, flat shards cut as tensor_split cuts (sizes differ by at most one), padded for all_gather."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = [t for t in params if t.requires_grad]
        p, r = dist.get_world_size(), dist.get_rank()
        total = sum(t.numel() for t in self.params)
        base, extra = divmod(total, p)
        self.sizes = [base + (1 if i < extra else 0) for i in range(p)]
        self.lo = sum(self.sizes[:r])
        self.hi = self.lo + self.sizes[r]
        with torch.no_grad():
            flat = torch.cat([t.detach().flatten() for t in self.params])
        self.shard = nn.Parameter(flat[self.lo:self.hi].clone())
        self.optimizer = optimizer_class([self.shard], **defaults)

    def zero_grad(self):
        for t in self.params:
            t.grad = None

    @torch.no_grad()
    def step(self):
        grads = torch.cat([t.grad.flatten() for t in self.params])
        self.shard.grad = grads[self.lo:self.hi].clone()
        self.optimizer.step()
        width = max(self.sizes)
        mine = torch.zeros(width, dtype=self.shard.dtype)
        mine[:self.hi - self.lo] = self.shard
        pieces = [torch.empty_like(mine) for _ in self.sizes]
        dist.all_gather(pieces, mine)
        flat = torch.cat([piece[:n] for piece, n in zip(pieces, self.sizes)])
        at = 0
        for t in self.params:
            t.copy_(flat[at:at + t.numel()].view_as(t))
            at += t.numel()


class ZeroGradMasked:
    """Correct, another way: one optimizer over every parameter, but each rank hands it gradients only for the
    tensors it owns (round robin); torch optimizers make state lazily, only for tensors with a gradient."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = [t for t in params if t.requires_grad]
        self.owner = [i % dist.get_world_size() for i in range(len(self.params))]
        self.optimizer = optimizer_class(self.params, **defaults)

    def zero_grad(self):
        for t in self.params:
            t.grad = None

    @torch.no_grad()
    def step(self):
        me = dist.get_rank()
        kept = [t.grad for t in self.params]
        for t, r in zip(self.params, self.owner):
            if r != me:
                t.grad = None
        self.optimizer.step()
        for t, g in zip(self.params, kept):
            t.grad = g
        for t, r in zip(self.params, self.owner):
            dist.broadcast(t, src=r)


class ZeroEveryoneEverything:
    """Right numbers; every rank keeps the whole optimizer over every parameter."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = [t for t in params if t.requires_grad]
        self.optimizer = optimizer_class(self.params, **defaults)

    def zero_grad(self):
        for t in self.params:
            t.grad = None

    @torch.no_grad()
    def step(self):
        self.optimizer.step()


class ZeroUntrimmedGather:
    """Wrong: shards of tensor_split's sizes, padded for all_gather, and the padding kept when concatenated."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = [t for t in params if t.requires_grad]
        p, r = dist.get_world_size(), dist.get_rank()
        total = sum(t.numel() for t in self.params)
        base, extra = divmod(total, p)
        self.sizes = [base + (1 if i < extra else 0) for i in range(p)]
        self.lo = sum(self.sizes[:r])
        self.hi = self.lo + self.sizes[r]
        with torch.no_grad():
            flat = torch.cat([t.detach().flatten() for t in self.params])
        self.shard = nn.Parameter(flat[self.lo:self.hi].clone())
        self.optimizer = optimizer_class([self.shard], **defaults)

    def zero_grad(self):
        for t in self.params:
            t.grad = None

    @torch.no_grad()
    def step(self):
        grads = torch.cat([t.grad.flatten() for t in self.params])
        self.shard.grad = grads[self.lo:self.hi].clone()
        self.optimizer.step()
        width = max(self.sizes)
        mine = torch.zeros(width, dtype=self.shard.dtype)
        mine[:self.hi - self.lo] = self.shard
        pieces = [torch.empty_like(mine) for _ in self.sizes]
        dist.all_gather(pieces, mine)
        flat = torch.cat(pieces)
        at = 0
        for t in self.params:
            t.copy_(flat[at:at + t.numel()].view_as(t))
            at += t.numel()


# ---------------------------------------------------------------- 4. f and g

class CopyToParallelClone(torch.autograd.Function):
    """Correct, with copies: forward hands a copy on, backward sums a copy."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        total = torch.empty_like(grad)
        total.copy_(grad)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total


class ReduceFromParallelClone(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        total = x + 0
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad.clone()


class CopyInPlaceBackward(torch.autograd.Function):
    """Wrong: sums the incoming gradient in place."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        dist.all_reduce(grad)
        return grad


class ReduceInPlaceForward(torch.autograd.Function):
    """Wrong: sums the tensor it is handed, in place."""

    @staticmethod
    def forward(ctx, x):
        dist.all_reduce(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class ReduceTwice(torch.autograd.Function):
    """Wrong: g sums in backward too."""

    @staticmethod
    def forward(ctx, x):
        total = x.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        total = grad.clone()
        dist.all_reduce(total)
        return total


class CopyIdentityBoth(torch.autograd.Function):
    """Wrong: f as the identity both ways."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


# the names the tensor-parallel MLP reads (correct f and g)
class CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        total = grad.clone()
        dist.all_reduce(total)
        return total


class ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        total = x.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


# ---------------------------------------------------------------- 5. tensor-parallel MLP

class ParallelMLPParams(nn.Module):
    """Correct, written differently: the rank's bounds by divmod, the slices as Parameters, F.linear."""

    def __init__(self, mlp):
        super().__init__()
        hidden = mlp.c_fc.weight.shape[0]
        p, r = dist.get_world_size(), dist.get_rank()
        base, extra = divmod(hidden, p)
        lo = r * base + min(r, extra)
        hi = lo + base + (1 if r < extra else 0)
        self.w_in = nn.Parameter(mlp.c_fc.weight.detach()[lo:hi].clone())
        self.b_in = nn.Parameter(mlp.c_fc.bias.detach()[lo:hi].clone())
        self.w_out = nn.Parameter(mlp.c_proj.weight.detach()[:, lo:hi].clone())
        self.b_out = nn.Parameter(mlp.c_proj.bias.detach().clone())
        self.dropout = mlp.dropout

    def forward(self, x):
        x = CopyToParallel.apply(x)
        hidden = F.gelu(F.linear(x, self.w_in, self.b_in), approximate="tanh")
        partial = F.linear(hidden, self.w_out)
        return self.dropout(ReduceFromParallel.apply(partial) + self.b_out)


class ParallelMLPLinears(nn.Module):
    """Correct, written differently, with the contract's names: bounds by divmod, the slices handed to fresh
    nn.Linear layers as new Parameters, c_proj applied as F.linear without its bias, the bias after g."""

    def __init__(self, mlp):
        super().__init__()
        hidden = mlp.c_fc.weight.shape[0]
        p, r = dist.get_world_size(), dist.get_rank()
        base, extra = divmod(hidden, p)
        lo = r * base + min(r, extra)
        hi = lo + base + (1 if r < extra else 0)
        dt = mlp.c_fc.weight.dtype
        self.c_fc = nn.Linear(mlp.c_fc.in_features, hi - lo, dtype=dt)
        self.c_proj = nn.Linear(hi - lo, mlp.c_proj.out_features, dtype=dt)
        self.c_fc.weight = nn.Parameter(mlp.c_fc.weight.detach()[lo:hi].clone())
        self.c_fc.bias = nn.Parameter(mlp.c_fc.bias.detach()[lo:hi].clone())
        self.c_proj.weight = nn.Parameter(mlp.c_proj.weight.detach()[:, lo:hi].clone())
        self.c_proj.bias = nn.Parameter(mlp.c_proj.bias.detach().clone())
        self.dropout = mlp.dropout

    def forward(self, x):
        hidden = F.gelu(self.c_fc(CopyToParallel.apply(x)), approximate="tanh")
        total = ReduceFromParallel.apply(F.linear(hidden, self.c_proj.weight))
        return self.dropout(total + self.c_proj.bias)


class ParallelMLPBiasEveryRank(nn.Module):
    """Wrong: c_proj's bias added before the sum."""

    def __init__(self, mlp):
        super().__init__()
        lo_hi = torch.arange(mlp.c_fc.out_features).tensor_split(dist.get_world_size())[dist.get_rank()]
        lo, hi = int(lo_hi[0]), int(lo_hi[-1]) + 1
        kind = mlp.c_fc.weight.dtype
        self.c_fc = nn.Linear(mlp.c_fc.in_features, hi - lo, dtype=kind)
        self.c_proj = nn.Linear(hi - lo, mlp.c_proj.out_features, dtype=kind)
        with torch.no_grad():
            self.c_fc.weight.copy_(mlp.c_fc.weight[lo:hi])
            self.c_fc.bias.copy_(mlp.c_fc.bias[lo:hi])
            self.c_proj.weight.copy_(mlp.c_proj.weight[:, lo:hi])
            self.c_proj.bias.copy_(mlp.c_proj.bias)
        self.dropout = mlp.dropout

    def forward(self, x):
        h = F.gelu(self.c_fc(CopyToParallel.apply(x)), approximate="tanh")
        return self.dropout(ReduceFromParallel.apply(self.c_proj(h)))


class ParallelMLPNoF(nn.Module):
    """Wrong: x enters without f, so its gradient misses the other ranks' part."""

    def __init__(self, mlp):
        super().__init__()
        lo_hi = torch.arange(mlp.c_fc.out_features).tensor_split(dist.get_world_size())[dist.get_rank()]
        lo, hi = int(lo_hi[0]), int(lo_hi[-1]) + 1
        kind = mlp.c_fc.weight.dtype
        self.c_fc = nn.Linear(mlp.c_fc.in_features, hi - lo, dtype=kind)
        self.c_proj = nn.Linear(hi - lo, mlp.c_proj.out_features, dtype=kind)
        with torch.no_grad():
            self.c_fc.weight.copy_(mlp.c_fc.weight[lo:hi])
            self.c_fc.bias.copy_(mlp.c_fc.bias[lo:hi])
            self.c_proj.weight.copy_(mlp.c_proj.weight[:, lo:hi])
            self.c_proj.bias.copy_(mlp.c_proj.bias)
        self.dropout = mlp.dropout

    def forward(self, x):
        h = F.gelu(self.c_fc(x), approximate="tanh")
        return self.dropout(ReduceFromParallel.apply(h @ self.c_proj.weight.T) + self.c_proj.bias)


class ParallelMLPCeilSlices(nn.Module):
    """Wrong: slices of ceil(4C / p), not tensor_split's."""

    def __init__(self, mlp):
        super().__init__()
        width = mlp.c_fc.out_features
        size = math.ceil(width / dist.get_world_size())
        lo = min(width, dist.get_rank() * size)
        hi = min(width, lo + size)
        kind = mlp.c_fc.weight.dtype
        self.c_fc = nn.Linear(mlp.c_fc.in_features, hi - lo, dtype=kind)
        self.c_proj = nn.Linear(hi - lo, mlp.c_proj.out_features, dtype=kind)
        with torch.no_grad():
            self.c_fc.weight.copy_(mlp.c_fc.weight[lo:hi])
            self.c_fc.bias.copy_(mlp.c_fc.bias[lo:hi])
            self.c_proj.weight.copy_(mlp.c_proj.weight[:, lo:hi])
            self.c_proj.bias.copy_(mlp.c_proj.bias)
        self.dropout = mlp.dropout

    def forward(self, x):
        h = F.gelu(self.c_fc(CopyToParallel.apply(x)), approximate="tanh")
        return self.dropout(ReduceFromParallel.apply(h @ self.c_proj.weight.T) + self.c_proj.bias)


class ParallelMLPWholeOnEveryRank(nn.Module):
    """Right output and gradient of x, no parallelism: every rank keeps and runs the whole MLP; the slices
    are there, unused."""

    def __init__(self, mlp):
        super().__init__()
        lo_hi = torch.arange(mlp.c_fc.out_features).tensor_split(dist.get_world_size())[dist.get_rank()]
        lo, hi = int(lo_hi[0]), int(lo_hi[-1]) + 1
        kind = mlp.c_fc.weight.dtype
        self.c_fc = nn.Linear(mlp.c_fc.in_features, hi - lo, dtype=kind)
        self.c_proj = nn.Linear(hi - lo, mlp.c_proj.out_features, dtype=kind)
        with torch.no_grad():
            self.c_fc.weight.copy_(mlp.c_fc.weight[lo:hi])
            self.c_fc.bias.copy_(mlp.c_fc.bias[lo:hi])
            self.c_proj.weight.copy_(mlp.c_proj.weight[:, lo:hi])
            self.c_proj.bias.copy_(mlp.c_proj.bias)
        self.register_buffer("w1", mlp.c_fc.weight.detach().clone())
        self.register_buffer("b1", mlp.c_fc.bias.detach().clone())
        self.register_buffer("w2", mlp.c_proj.weight.detach().clone())
        self.register_buffer("b2", mlp.c_proj.bias.detach().clone())
        self.dropout = mlp.dropout

    def forward(self, x):
        return self.dropout(F.linear(F.gelu(F.linear(x, self.w1, self.b1), approximate="tanh"), self.w2, self.b2))


# ---------------------------------------------------------------- the cases

ACCEPT = [
    ("ring", lambda: check.ring_all_reduce(ring_shifted_start)),
    ("ddp", lambda: check.ddp(DDPCounters)),
    ("zero_whole_tensors", lambda: check.zero_optimizer(ZeroWholeTensors)),
    ("zero_split_evenly", lambda: check.zero_optimizer(ZeroSplitEvenly)),
    ("f_and_g", lambda: check.f_and_g(CopyToParallelClone, ReduceFromParallelClone)),
    ("parallel_mlp", lambda: check.parallel_mlp(ParallelMLPLinears)),
]

REJECT = [
    ("ring_whole_tensor", lambda: check.ring_all_reduce(ring_whole_tensor)),
    ("ring_collective", lambda: check.ring_all_reduce(ring_collective)),
    ("ring_gather_adds", lambda: check.ring_all_reduce(ring_gather_adds)),
    ("ring_on_a_copy", lambda: check.ring_all_reduce(ring_on_a_copy)),
    ("ddp_send_in_finish", lambda: check.ddp(DDPSendInFinish)),
    ("ddp_one_per_landing", lambda: check.ddp(DDPOnePerLanding)),
    ("ddp_strictly_above", lambda: check.ddp(DDPStrictlyAbove)),
    ("ddp_completion_order", lambda: check.ddp(DDPCompletionOrder)),
    ("ddp_no_sync_counts", lambda: check.ddp(DDPNoSyncStillCounts)),
    ("ddp_no_broadcast", lambda: check.ddp(DDPNoBroadcast)),
    ("zero_everything", lambda: check.zero_optimizer(ZeroEveryoneEverything)),
    ("zero_grad_masked", lambda: check.zero_optimizer(ZeroGradMasked)),
    ("zero_untrimmed", lambda: check.zero_optimizer(ZeroUntrimmedGather)),
    ("f_in_place_backward", lambda: check.f_and_g(CopyInPlaceBackward, ReduceFromParallel)),
    ("g_in_place_forward", lambda: check.f_and_g(CopyToParallel, ReduceInPlaceForward)),
    ("g_reduces_twice", lambda: check.f_and_g(CopyToParallel, ReduceTwice)),
    ("f_identity", lambda: check.f_and_g(CopyIdentityBoth, ReduceFromParallel)),
    ("mlp_bias_every_rank", lambda: check.parallel_mlp(ParallelMLPBiasEveryRank)),
    ("mlp_no_f", lambda: check.parallel_mlp(ParallelMLPNoF)),
    ("mlp_ceil_slices", lambda: check.parallel_mlp(ParallelMLPCeilSlices)),
    ("mlp_other_names", lambda: check.parallel_mlp(ParallelMLPParams)),
    ("mlp_whole_on_every_rank", lambda: check.parallel_mlp(ParallelMLPWholeOnEveryRank)),
]


@pytest.mark.parametrize("name, run", ACCEPT, ids=[c[0] for c in ACCEPT])
def test_accept(name, run):
    run()


@pytest.mark.parametrize("name, run", REJECT, ids=[c[0] for c in REJECT])
def test_reject(name, run):
    with pytest.raises(CheckFailed) as info:
        run()
    print(str(info.value)[:800])
