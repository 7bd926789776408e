"""Chapter 11's checks pass on the reference and reject the usual mistakes, including those that get the values
right and the point of the exercise wrong: a ring that passes whole tensors, a DDP that all-reduces after
backward, a ZeRO that keeps the whole optimizer state on every rank, a collective that autograd cannot see,
an MLP that every rank holds whole.

Each check launches worker processes (forked from a server that has imported torch: under a second each,
after the first), so the default run tries each check on two or three wrong implementations; the tests
marked slow (make sweep) add the references at world sizes 2, 3 and 4 and more mistakes. The
implementations are written as a learner would write them in a notebook (module __main__), so they reach
the workers as source, the way the learner's do.
"""

import contextlib
import inspect
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from checking import expect_failure, expect_pass

from course_lib.checks import ch11 as check
from course_lib.distributed import Code


def notebook(obj):
    obj.__module__ = "__main__"
    return obj


HEADER = """import contextlib
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
"""


def code(cls):
    """A class of this file as the workers get a learner's: as source text, after the classes it builds on
    (its bases in this file, and f and g, which the MLPs name)."""
    chain = [c for c in reversed(cls.__mro__) if c.__module__ == __name__]
    helpers = [c for c in (CopyToParallel, ReduceFromParallel) if c not in chain]
    return Code(HEADER + "\n\n".join(inspect.getsource(c) for c in helpers + chain), cls.__name__)


# ---- 1. the ring ----------------------------------------------------------------------------------

@notebook
def ring(tensor, gather=True, average=False):
    rank, p = dist.get_rank(), dist.get_world_size()
    parts = tensor.view(-1).tensor_split(p)
    for phase in ("reduce", "gather") if gather else ("reduce",):
        for s in range(p - 1):
            out = parts[(rank - s + (phase == "gather")) % p]
            into = parts[(rank - s - 1 + (phase == "gather")) % p]
            buffer = torch.empty_like(into)
            request = dist.isend(out.clone(), (rank + 1) % p)
            dist.recv(buffer, (rank - 1) % p)
            request.wait()
            if phase == "reduce":
                into += buffer
            else:
                into.copy_(buffer)
    if average:
        tensor /= p
    return tensor


@notebook
def ring_without_all_gather(tensor):
    return ring(tensor, gather=False)


@notebook
def ring_averaging(tensor):
    return ring(tensor, average=True)


@notebook
def ring_passing_whole_tensors(tensor):
    """The lesson's whole-tensor ring: the right sum, (p - 1)·n numbers sent per rank."""
    rank, p = dist.get_rank(), dist.get_world_size()
    travelling, arriving = tensor.clone(), torch.empty_like(tensor)
    for _ in range(p - 1):
        request = dist.isend(travelling, (rank + 1) % p)
        dist.recv(arriving, (rank - 1) % p)
        request.wait()
        tensor += arriving
        travelling, arriving = arriving, travelling
    return tensor


@notebook
def through_rank_0(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        for src in range(1, p):
            other = torch.empty_like(tensor)
            dist.recv(other, src)
            tensor += other
        for dst in range(1, p):
            dist.send(tensor, dst)
    else:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)
    return tensor


@notebook
def ring_with_dist_all_reduce(tensor):
    dist.all_reduce(tensor)
    return tensor


@notebook
def not_yet(tensor):
    raise NotImplementedError


def test_ring_check():
    expect_failure(check.ring_all_reduce, ring_without_all_gather, match="all-gather")
    expect_failure(check.ring_all_reduce, ring_passing_whole_tensors, match="never the whole tensor")
    expect_failure(check.ring_all_reduce, through_rank_0, match="one neighbour")


# ---- 2. DDP --------------------------------------------------------------------------------------

class Ddp(nn.Module):
    """A correct DDP whose class attributes switch on one mistake each (subclasses below)."""

    reverse, broadcast, during_backward, asynchronous, divide_in_hook, early, quiet_counts = (
        True, True, True, True, False, False, False)

    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module = module
        if self.broadcast:
            with torch.no_grad():
                for t in module.parameters():
                    dist.broadcast(t, 0)
        params = list(module.parameters())
        self.buckets, current, size = [], [], 0
        for t in params[::-1] if self.reverse else params:
            current.append(t)
            size += t.numel() * t.element_size()
            if size >= bucket_bytes:
                self.buckets.append(current)
                current, size = [], 0
        if current:
            self.buckets.append(current)
        self.index = {t: i for i, b in enumerate(self.buckets) for t in b}
        for t in params:
            t.register_post_accumulate_grad_hook(self.hook)
        self.syncing, self.counts, self.sent = True, [0] * len(self.buckets), []

    def forward(self, x):
        return self.module(x)

    def hook(self, param):
        if not self.syncing and not self.quiet_counts:
            return
        self.counts[self.index[param]] += 1
        if not self.syncing or not self.during_backward:
            return
        self.send_ready()

    def send_ready(self):
        i = len(self.sent)
        while i < len(self.buckets) and self.counts[i] >= len(self.buckets[i]) - self.early:
            flat = torch.cat([(t.grad if t.grad is not None else torch.zeros_like(t)).reshape(-1)
                              for t in self.buckets[i]])
            if self.divide_in_hook:
                flat /= dist.get_world_size()
            work = dist.all_reduce(flat, async_op=self.asynchronous)
            self.sent.append((i, flat, work))
            i += 1

    def finish(self):
        if not self.during_backward:
            self.counts = [len(b) for b in self.buckets]
            self.send_ready()
        for i, flat, work in self.sent:
            if work is not None:
                work.wait()
            flat /= dist.get_world_size()
            offset = 0
            for t in self.buckets[i]:
                t.grad.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
        self.counts, self.sent = [0] * len(self.buckets), []

    @contextlib.contextmanager
    def no_sync(self):
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True


class DdpAllReducingAfterBackward(Ddp):
    during_backward = False        # the right gradients; nothing overlaps the backward


class DdpAveragingTwice(Ddp):
    divide_in_hook = True


class DdpBucketsInForwardOrder(Ddp):
    reverse = False


class DdpWithoutBroadcast(Ddp):
    broadcast = False


class DdpBlocking(Ddp):
    asynchronous = False


class DdpFlushingEarly(Ddp):
    early = True


class DdpCountingInsideNoSync(Ddp):
    quiet_counts = True            # no_sync's gradients are counted: the next backward sends buckets early


class DdpSendingInsideNoSync(Ddp):
    @contextlib.contextmanager
    def no_sync(self):
        yield                      # a no-op: every micro-batch is all-reduced


def test_ddp_check():
    expect_failure(check.ddp, code(DdpAllReducingAfterBackward), match="no bucket was sent during backward")
    expect_failure(check.ddp, code(DdpAveragingTwice), match="divided by the world size twice")
    expect_failure(check.ddp, code(DdpBucketsInForwardOrder), match="reverse order")


# ---- 3. ZeRO-1 -----------------------------------------------------------------------------------

class Zero:
    """A correct ZeRO-1 wrapper whose class attributes switch on one mistake each (subclasses below)."""

    whole_state, gather, off_by_one, fixed_class = False, True, 0, None

    def __init__(self, params, optimizer_class, **defaults):
        self.params = list(params)
        self.n = sum(t.numel() for t in self.params)
        self.size = math.ceil(self.n / dist.get_world_size())
        self.lo = min(dist.get_rank() * self.size, self.n)
        self.hi = min(self.lo + self.size - self.off_by_one, self.n)
        cls = self.fixed_class or optimizer_class
        if self.fixed_class is not None:
            defaults = {}              # AdamW written in, with its own hyperparameters
        if self.whole_state:
            self.optimizer = cls(self.params, **defaults)
        else:
            self.shard = torch.cat([t.detach().reshape(-1) for t in self.params])[self.lo:self.hi].clone()
            self.optimizer = cls([self.shard.requires_grad_()], **defaults)

    def zero_grad(self):
        for t in self.params:
            t.grad = None

    @torch.no_grad()
    def step(self):
        if self.whole_state:       # every rank steps everything: the right numbers, p copies of the state
            self.optimizer.step()
            return
        self.shard.grad = torch.cat([t.grad.reshape(-1) for t in self.params])[self.lo:self.hi].clone()
        self.optimizer.step()
        flat = torch.cat([t.reshape(-1) for t in self.params])
        if self.gather:
            mine = flat.new_zeros(self.size)
            mine[:self.hi - self.lo] = self.shard
            pieces = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(pieces, mine)
            flat = torch.cat(pieces)[:self.n]
        else:
            flat[self.lo:self.hi] = self.shard
        offset = 0
        for t in self.params:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


class ZeroWithWholeState(Zero):
    whole_state = True


class ZeroWithoutAllGather(Zero):
    gather = False


class ZeroShardOffByOne(Zero):
    off_by_one = 1


class ZeroAlwaysAdamW(Zero):
    fixed_class = torch.optim.AdamW


def test_zero_check():
    expect_failure(check.zero_optimizer, code(ZeroWithWholeState), match="its own shard only, 1/p of it")
    expect_failure(check.zero_optimizer, code(ZeroWithoutAllGather), match="all-gather")


# ---- 4. f and g ----------------------------------------------------------------------------------

class CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


@notebook
def BareF(x):
    return x.view_as(x)                # identity, no Function: x's gradient is never summed


@notebook
def BareG(x):
    total = x.clone()
    dist.all_reduce(total)             # the right sum, and by luck the right gradient: autograd never saw it
    return total


class GSummingInBackwardToo(ReduceFromParallel):
    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class FSummingInForward(ReduceFromParallel):   # f and g swapped
    pass


class GSummingInBackward(CopyToParallel):
    pass


class FWithIdentityBackward(CopyToParallel):
    @staticmethod
    def backward(ctx, grad):
        return grad


class GSummingItsInput(ReduceFromParallel):
    @staticmethod
    def forward(ctx, x):
        dist.all_reduce(x)             # the caller's tensor, changed in place
        return x.view_as(x)


class FSummingItsGradient(CopyToParallel):
    @staticmethod
    def backward(ctx, grad):
        dist.all_reduce(grad)          # the gradient autograd handed over, changed in place
        return grad


def test_f_and_g_check():
    expect_failure(check.f_and_g, BareF, BareG, match="not a torch.autograd.Function")
    expect_failure(check.f_and_g, code(CopyToParallel), code(GSummingInBackwardToo), match="backward is the identity")
    expect_failure(check.f_and_g, code(FSummingInForward), code(GSummingInBackward), match="forward is the identity")


# ---- 5. the tensor-parallel MLP ------------------------------------------------------------------

class Mlp(nn.Module):
    """A correct tensor-parallel MLP whose class attributes switch on one mistake each (subclasses below)."""

    split, use_f, use_g, bias_after = True, True, True, True

    def __init__(self, mlp):
        super().__init__()
        p, rank = (dist.get_world_size(), dist.get_rank()) if self.split else (1, 0)
        sizes = [len(c) for c in torch.arange(mlp.c_fc.out_features).tensor_split(p)]
        lo = sum(sizes[:rank])
        hi = lo + sizes[rank]
        self.c_fc = nn.Linear(mlp.c_fc.in_features, hi - lo, dtype=mlp.c_fc.weight.dtype)
        self.c_proj = nn.Linear(hi - lo, mlp.c_proj.out_features, dtype=mlp.c_fc.weight.dtype)
        with torch.no_grad():
            self.c_fc.weight.copy_(mlp.c_fc.weight[lo:hi])
            self.c_fc.bias.copy_(mlp.c_fc.bias[lo:hi])
            self.c_proj.weight.copy_(mlp.c_proj.weight[:, lo:hi])
            self.c_proj.bias.copy_(mlp.c_proj.bias)
        self.dropout = mlp.dropout

    def forward(self, x):
        h = F.gelu(self.c_fc(CopyToParallel.apply(x) if self.use_f else x), approximate="tanh")
        partial = h @ self.c_proj.weight.T
        if not self.bias_after:
            partial = partial + self.c_proj.bias
        if not self.split:
            total = partial
        elif self.use_g:
            total = ReduceFromParallel.apply(partial)
        else:
            total = partial
            dist.all_reduce(total)     # in place, unseen by autograd: the same numbers here
        return self.dropout(total + self.c_proj.bias if self.bias_after else total)


class MlpWithBareAllReduce(Mlp):
    use_g = False


class MlpWholeOnEveryRank(Mlp):
    split = False                  # the right numbers, no communication, and no memory saved


class MlpWithoutF(Mlp):
    use_f = False


class MlpBiasBeforeTheSum(Mlp):
    bias_after = False


def test_parallel_mlp_check():
    expect_failure(check.parallel_mlp, code(MlpWithBareAllReduce), match="holds no ReduceFromParallel")
    expect_failure(check.parallel_mlp, code(MlpWholeOnEveryRank), match="every rank holds the whole MLP")
    expect_failure(check.parallel_mlp, code(MlpBiasBeforeTheSum), match="bias once")


# ---- the sweep: the references pass, and more mistakes are caught, at world sizes 2, 3 and 4 ---------

@pytest.mark.slow
@pytest.mark.parametrize("worlds", ["2", "3", "4"])
def test_checks_pass_on_the_references(worlds, monkeypatch):
    monkeypatch.setenv("COURSE_WORLD_SIZES", worlds)
    expect_pass(check.ring_all_reduce, ring)
    expect_pass(check.ddp, code(Ddp))
    expect_pass(check.zero_optimizer, code(Zero))
    expect_pass(check.f_and_g, code(CopyToParallel), code(ReduceFromParallel))
    expect_pass(check.parallel_mlp, code(Mlp))


@pytest.mark.slow
@pytest.mark.parametrize("worlds", ["2", "3", "4"])
def test_more_mistakes_are_caught(worlds, monkeypatch):
    monkeypatch.setenv("COURSE_WORLD_SIZES", worlds)
    p = int(worlds)
    expect_failure(check.ring_all_reduce, ring_averaging, match="does not average")
    expect_failure(check.ring_all_reduce, ring_with_dist_all_reduce, match="off limits")
    expect_failure(check.ring_all_reduce, not_yet, match="not implemented yet")
    if p > 2:   # at p = 2 both neighbours are the same rank, and rank 0's link carries what a ring's does
        expect_failure(check.ring_all_reduce, through_rank_0, match="one neighbour")
        expect_failure(check.ring_all_reduce, ring_passing_whole_tensors, match="never the whole tensor")
    expect_failure(check.ddp, code(DdpAllReducingAfterBackward), match="no bucket was sent during backward")
    expect_failure(check.ddp, code(DdpWithoutBroadcast), match="is not rank 0's")
    expect_failure(check.ddp, code(DdpBlocking), match="async_op=False")
    expect_failure(check.ddp, code(DdpFlushingEarly), match="before its last gradient")
    expect_failure(check.ddp, code(DdpCountingInsideNoSync), match="before its last gradient")
    expect_failure(check.ddp, code(DdpSendingInsideNoSync), match="no_sync")
    expect_failure(check.zero_optimizer, code(ZeroWithWholeState), match="1/p")
    expect_failure(check.zero_optimizer, code(ZeroShardOffByOne), match="differ from torch.optim")
    expect_failure(check.zero_optimizer, code(ZeroAlwaysAdamW), match="differ from torch.optim.AdamW")
    expect_failure(check.f_and_g, code(FWithIdentityBackward), code(ReduceFromParallel),
                   match="sums the gradients over the ranks")
    expect_failure(check.f_and_g, code(CopyToParallel), code(GSummingItsInput), match="changed its input")
    expect_failure(check.f_and_g, code(FSummingItsGradient), code(ReduceFromParallel), match="changed the gradient")
    expect_failure(check.parallel_mlp, code(MlpWithoutF), match="CopyToParallel")
