"""Chapter 11's checks test what the chapter teaches, and accept every correct answer.

For each exercise, the default run proves both sides:
- rejected, with the right numbers and the property wrong: a ring that passes whole tensors, or gathers on
  rank 0; a DDP that all-reduces after backward, one that sends one ready bucket per landing gradient (`if`,
  not `while`), one whose buckets close only strictly above bucket_bytes, one whose buckets follow the
  forward order (nothing overlaps); a ZeRO that keeps the whole state on every rank, or all of it on rank 0;
  f and g outside autograd, or changing the tensor they are handed; an MLP that every rank holds whole, or
  whose partial sums meet in a bare all-reduce;
- accepted, correct and written differently: a ring that turns the other way with blocking, parity-ordered
  messages; a DDP whose buckets fill in the order the gradients land and travel pre-divided; a ZeRO that deals
  whole tensors out to the ranks (as PyTorch's ZeroRedundancyOptimizer does); f and g built on all_gather;
  an MLP with its own slice arithmetic; and the course's own answers in course_lib/distributed.

Each check launches worker processes (forked from a server that has imported torch: under a second each,
after the first). The tests marked slow (make sweep) run the references at world sizes 2, 3 and 4 and more
mistakes. The implementations are written as a learner would write them in a notebook (module __main__), so
they reach the workers as source, the way the learner's do.
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
from course_lib.distributed import Code, collectives, ddp, tensor_parallel, zero


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


@notebook
def ring_the_other_way(tensor):
    """A correct ring written differently: it sends to the left and receives from the right, with blocking
    sends and receives ordered by the rank's parity, over chunks of ceil(n/p) numbers (the last ones shorter)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    flat, n = tensor.view(-1), tensor.numel()
    width = -(-n // p)
    chunk = [flat[min(c * width, n):min((c + 1) * width, n)] for c in range(p)]
    left, right = (rank - 1) % p, (rank + 1) % p
    for phase in range(2):
        for s in range(p - 1):
            out = chunk[(rank + s + 1 - phase) % p]
            into = chunk[(rank + s + 2 - phase) % p]
            got = torch.empty_like(into)
            if rank % 2 == 0:
                if out.numel():
                    dist.send(out.clone(), left)
                if got.numel():
                    dist.recv(got, right)
            else:
                if got.numel():
                    dist.recv(got, right)
                if out.numel():
                    dist.send(out.clone(), left)
            if phase == 0:
                into += got
            else:
                into.copy_(got)
    return tensor


def test_ring_check_rejects_the_right_sum_sent_the_wrong_way():
    expect_failure(check.ring_all_reduce, ring_passing_whole_tensors, match="never the whole tensor")
    expect_failure(check.ring_all_reduce, through_rank_0, match="one neighbour")
    expect_failure(check.ring_all_reduce, ring_without_all_gather, match="all-gather")


def test_ring_check_accepts_another_ring_and_the_courses():
    expect_pass(check.ring_all_reduce, ring_the_other_way)
    expect_pass(check.ring_all_reduce, collectives.ring_all_reduce)


# ---- 2. DDP --------------------------------------------------------------------------------------

class Ddp(nn.Module):
    """A correct DDP (buckets in reverse parameter order) whose class attributes switch on one mistake each
    (subclasses below)."""

    reverse, broadcast, during_backward, asynchronous, divide_in_hook, early, quiet_counts = (
        True, True, True, True, False, False, False)
    flush_every_ready_bucket, strictly_above = True, False

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
            if (size > bucket_bytes) if self.strictly_above else (size >= bucket_bytes):
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
        i = len(self.sent)
        while i < len(self.buckets) and self.counts[i] >= len(self.buckets[i]) - self.early:
            self.send(i)
            i += 1
            if not self.flush_every_ready_bucket:
                break

    def send(self, i):
        flat = torch.cat([(t.grad if t.grad is not None else torch.zeros_like(t)).reshape(-1)
                          for t in self.buckets[i]])
        if self.divide_in_hook:
            flat /= dist.get_world_size()
        work = dist.all_reduce(flat, async_op=self.asynchronous)
        self.sent.append((i, flat, work))

    def finish(self):
        while len(self.sent) < len(self.buckets):   # what the hooks left: everything, when they send nothing
            self.send(len(self.sent))
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


class DdpFlushingOneBucketPerGradient(Ddp):
    flush_every_ready_bucket = False   # `if`, not `while`: right when gradients land in reverse order, late otherwise


class DdpClosingAboveTheSize(Ddp):
    strictly_above = True          # a bucket that reaches bucket_bytes exactly stays open for one more tensor


class DdpBucketsInForwardOrder(Ddp):
    reverse = False                # the right gradients; the first bucket waits for the last gradient to land


class DdpAveragingTwice(Ddp):
    divide_in_hook = True


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


class DdpInLandingOrder(nn.Module):
    """Wrong where the ranks' gradients land in different orders: its buckets fill in the order the gradients
    land on each rank (PyTorch's DDP, which rebuilds its buckets after the first step, takes rank 0's order on
    every rank), so two ranks may pair different buckets. Right wherever they land alike; every gradient is
    divided by the world size before it travels; the broadcast sends one flat tensor."""

    def __init__(self, module, bucket_bytes=25 * 2**20):
        super().__init__()
        self.module, self.bucket_bytes = module, bucket_bytes
        self.params = [t for t in module.parameters() if t.requires_grad]
        with torch.no_grad():
            flat = torch.cat([t.reshape(-1) for t in self.params])
            dist.broadcast(flat, 0)
            torch.nn.utils.vector_to_parameters(flat, self.params)
        for t in self.params:
            t.register_post_accumulate_grad_hook(self.landed)
        self.accumulating = False
        self.open, self.nbytes, self.count, self.flying = [], 0, 0, []

    def forward(self, *args):
        return self.module(*args)

    def landed(self, t):
        if self.accumulating:
            return
        self.open.append(t)
        self.nbytes += t.numel() * t.element_size()
        self.count += 1
        if self.nbytes >= self.bucket_bytes or self.count == len(self.params):
            flat = torch.cat([u.grad.reshape(-1) for u in self.open]) / dist.get_world_size()
            self.flying.append((self.open, flat, dist.all_reduce(flat, async_op=True)))
            self.open, self.nbytes = [], 0

    def finish(self):
        for bucket, flat, work in self.flying:
            work.wait()
            torch.nn.utils.vector_to_parameters(flat, [t.grad for t in bucket])
        self.flying, self.count = [], 0

    @contextlib.contextmanager
    def no_sync(self):
        self.accumulating = True
        try:
            yield
        finally:
            self.accumulating = False


def test_ddp_check_rejects_the_right_numbers_sent_at_the_wrong_time():
    expect_failure(check.ddp, code(DdpAllReducingAfterBackward), match="no bucket was sent during backward")
    expect_failure(check.ddp, code(DdpFlushingOneBucketPerGradient), match="were complete but only")
    expect_failure(check.ddp, code(DdpClosingAboveTheSize), match="before its last tensor")
    expect_failure(check.ddp, code(DdpBucketsInForwardOrder), match="none of the communication overlapped")
    expect_failure(check.ddp, code(DdpInLandingOrder), match="whatever order its gradients land in")


def test_ddp_check_accepts_other_bucket_orders_and_the_courses():
    expect_pass(check.ddp, code(Ddp))
    expect_pass(check.ddp, ddp.DDP)


# ---- 3. ZeRO-1 -----------------------------------------------------------------------------------

class Zero:
    """A correct ZeRO-1 wrapper (flat shards of ceil(N/p)) whose class attributes switch on one mistake each
    (subclasses below)."""

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


class ZeroOnRankZero:
    """The right numbers, all of the state on one rank: rank 0 updates everything and broadcasts it."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = list(params)
        self.optimizer = optimizer_class(self.params, **defaults) if dist.get_rank() == 0 else None

    def zero_grad(self):
        for t in self.params:
            t.grad = None

    @torch.no_grad()
    def step(self):
        if self.optimizer is not None:
            self.optimizer.step()
        for t in self.params:
            dist.broadcast(t, 0)


class ZeroPerTensor:
    """A correct ZeRO-1 written differently, as PyTorch's ZeroRedundancyOptimizer shards: whole tensors dealt out,
    the largest first, each to the rank that holds the fewest numbers so far; each rank steps its own tensors
    in place (no copy, no padding) and broadcasts them; a rank dealt nothing makes no optimizer."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = [t for t in params if t.requires_grad]
        load = [0] * dist.get_world_size()
        self.owner = {}
        for t in sorted(self.params, key=lambda t: -t.numel()):
            rank = load.index(min(load))
            self.owner[t] = rank
            load[rank] += t.numel()
        mine = [t for t in self.params if self.owner[t] == dist.get_rank()]
        self.local = optimizer_class(mine, **defaults) if mine else None

    def zero_grad(self):
        for t in self.params:
            t.grad = None

    @torch.no_grad()
    def step(self):
        if self.local is not None:
            self.local.step()
        for t in self.params:
            dist.broadcast(t, self.owner[t])


def test_zero_check_rejects_the_right_numbers_with_the_state_not_split():
    expect_failure(check.zero_optimizer, code(ZeroWithWholeState), match="keeps")
    expect_failure(check.zero_optimizer, code(ZeroOnRankZero), match="rank 0 keeps")
    expect_failure(check.zero_optimizer, code(ZeroWithoutAllGather), match="differ from rank 0's")


def test_zero_check_accepts_any_split_of_the_state_and_the_courses():
    expect_pass(check.zero_optimizer, code(ZeroPerTensor))
    expect_pass(check.zero_optimizer, code(Zero))
    expect_pass(check.zero_optimizer, zero.ZeroOptimizer)


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


class CopyByClone(torch.autograd.Function):
    """A correct f written differently: a copy forward; backward, the ranks' gradients gathered and added."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        pieces = [torch.empty_like(grad) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, grad.contiguous())
        return torch.stack(pieces).sum(0)


class ReduceByGather(torch.autograd.Function):
    """A correct g written differently: forward, the ranks' partial results gathered and added."""

    @staticmethod
    def forward(ctx, x):
        pieces = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, x.contiguous())
        return torch.stack(pieces).sum(0)

    @staticmethod
    def backward(ctx, grad):
        return grad.clone()


def test_f_and_g_check_rejects_the_right_numbers_out_of_autograd_or_in_place():
    expect_failure(check.f_and_g, BareF, BareG, match="not a torch.autograd.Function")
    expect_failure(check.f_and_g, code(CopyToParallel), code(GSummingItsInput), match="changed its input")
    expect_failure(check.f_and_g, code(CopyToParallel), code(GSummingInBackwardToo),
                   match="summed over the ranks where the partial sums meet")
    expect_failure(check.f_and_g, code(FSummingInForward), code(GSummingInBackward),
                   match="summed over the ranks where x enters")


def test_f_and_g_check_accepts_other_collectives_and_the_courses():
    expect_pass(check.f_and_g, Code(HEADER + inspect.getsource(CopyByClone), "CopyByClone"),
                Code(HEADER + inspect.getsource(ReduceByGather), "ReduceByGather"))
    expect_pass(check.f_and_g, tensor_parallel.CopyToParallel, tensor_parallel.ReduceFromParallel)


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


class MlpWrittenDifferently(nn.Module):
    """A correct tensor-parallel MLP written differently: its own slice arithmetic, parameters set whole (no copy
    under no_grad), F.linear throughout, and the bias added after g in its own step."""

    def __init__(self, mlp):
        super().__init__()
        width, p, rank = mlp.c_fc.out_features, dist.get_world_size(), dist.get_rank()
        per, extra = divmod(width, p)
        lo = rank * per + min(rank, extra)
        hi = lo + per + (rank < extra)
        self.c_fc = nn.Linear(mlp.c_fc.in_features, hi - lo).to(mlp.c_fc.weight.dtype)
        self.c_proj = nn.Linear(hi - lo, mlp.c_proj.out_features).to(mlp.c_proj.weight.dtype)
        self.c_fc.weight = nn.Parameter(mlp.c_fc.weight.detach()[lo:hi].clone())
        self.c_fc.bias = nn.Parameter(mlp.c_fc.bias.detach()[lo:hi].clone())
        self.c_proj.weight = nn.Parameter(mlp.c_proj.weight.detach()[:, lo:hi].clone())
        self.c_proj.bias = nn.Parameter(mlp.c_proj.bias.detach().clone())
        self.dropout = mlp.dropout

    def forward(self, x):
        hidden = F.gelu(F.linear(CopyToParallel.apply(x), self.c_fc.weight, self.c_fc.bias), approximate="tanh")
        total = ReduceFromParallel.apply(F.linear(hidden, self.c_proj.weight))
        total = total + self.c_proj.bias
        return self.dropout(total)


def test_parallel_mlp_check_rejects_the_right_numbers_without_the_split_or_g():
    expect_failure(check.parallel_mlp, code(MlpWithBareAllReduce), match="holds no ReduceFromParallel")
    expect_failure(check.parallel_mlp, code(MlpWholeOnEveryRank), match="every rank holds the whole MLP")
    expect_failure(check.parallel_mlp, code(MlpBiasBeforeTheSum), match="counts p times")


def test_parallel_mlp_check_accepts_another_mlp_and_the_courses():
    expect_pass(check.parallel_mlp, code(MlpWrittenDifferently))
    expect_pass(check.parallel_mlp, tensor_parallel.ParallelMLP)


# ---- the sweep: the references pass, and more mistakes are caught, at world sizes 2, 3 and 4 ---------

@pytest.mark.slow
@pytest.mark.parametrize("worlds", ["2", "3", "4"])
def test_checks_pass_on_the_references(worlds, monkeypatch):
    monkeypatch.setenv("COURSE_WORLD_SIZES", worlds)
    expect_pass(check.ring_all_reduce, ring)
    expect_pass(check.ring_all_reduce, ring_the_other_way)
    expect_pass(check.ddp, code(Ddp))
    expect_pass(check.zero_optimizer, code(ZeroPerTensor))
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
    expect_failure(check.ddp, code(DdpFlushingOneBucketPerGradient), match="were complete but only")
    expect_failure(check.ddp, code(DdpClosingAboveTheSize), match="before its last tensor")
    expect_failure(check.ddp, code(DdpAveragingTwice), match="divided by the world size twice")
    expect_failure(check.ddp, code(DdpWithoutBroadcast), match="is not rank 0's")
    expect_failure(check.ddp, code(DdpBlocking), match="async_op=False")
    expect_failure(check.ddp, code(DdpFlushingEarly), match="had landed")
    expect_failure(check.ddp, code(DdpCountingInsideNoSync), match="had landed")
    expect_failure(check.ddp, code(DdpSendingInsideNoSync), match="no_sync")
    expect_failure(check.zero_optimizer, code(ZeroWithWholeState), match="keeps")
    expect_failure(check.zero_optimizer, code(ZeroOnRankZero), match="rank 0 keeps")
    expect_failure(check.zero_optimizer, code(ZeroShardOffByOne), match="differ from torch.optim")
    expect_failure(check.zero_optimizer, code(ZeroAlwaysAdamW), match="differ from torch.optim.AdamW")
    expect_failure(check.f_and_g, code(FWithIdentityBackward), code(ReduceFromParallel),
                   match="x fed every rank's slice")
    expect_failure(check.f_and_g, code(CopyToParallel), code(GSummingItsInput), match="changed its input")
    expect_failure(check.f_and_g, code(FSummingItsGradient), code(ReduceFromParallel), match="changed the gradient")
    expect_failure(check.parallel_mlp, code(MlpWithoutF), match="CopyToParallel")
