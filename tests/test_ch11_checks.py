"""Chapter 11's checks pass on the reference and reject the usual mistakes.

Each check starts its own worker processes (seconds each, more on loaded cores), so by default every
check runs on two wrong implementations only; the solutions notebook (nbval) proves they pass on the
reference, and the tests marked slow (make sweep) add the references and more mistakes.
The implementations are written as a learner would write them in a notebook
(module __main__), so they reach the workers as source, the way the learner's do.
"""

import pytest
import torch
import torch.distributed as dist
from checking import expect_failure, expect_pass

from course_lib.checks import ch11 as check


def notebook(obj):
    obj.__module__ = "__main__"
    return obj


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
def not_yet(tensor):
    raise NotImplementedError


def test_ring_check():
    expect_failure(check.ring_all_reduce, ring_without_all_gather, match="all-gather")
    expect_failure(check.ring_all_reduce, through_rank_0, match="one neighbour")


@pytest.mark.slow   # a launch each: the references pass, and more mistakes are caught
def test_checks_pass_on_the_references():
    expect_pass(check.ring_all_reduce, ring)
    expect_pass(check.bucket_hook, hook)
    expect_pass(check.zero_step, zero)
    expect_pass(check.row_parallel_forward, row_forward)


@pytest.mark.slow
def test_more_mistakes_are_caught():
    expect_failure(check.zero_step, zero_without_all_gather, match="all-gather")
    expect_failure(check.row_parallel_forward, row_forward_reducing_in_backward_too, match="identity")
    expect_failure(check.ring_all_reduce, ring_averaging, match="does not average")
    expect_failure(check.ring_all_reduce, not_yet, match="not implemented yet")


# ---- 2. the bucketed hook ------------------------------------------------------------------------

@notebook
def hook(ddp, param, divide=False, early=False):
    ddp.arrived[ddp.bucket_of[param]] += 1
    i = len(ddp.inflight)
    while i < len(ddp.buckets) and ddp.arrived[i] >= len(ddp.buckets[i]) - early:
        grads = [(q.grad if q.grad is not None else torch.zeros_like(q)).reshape(-1) for q in ddp.buckets[i]]
        flat = torch.cat(grads)
        if divide:
            flat /= ddp.world_size
        ddp.inflight.append((i, flat, dist.all_reduce(flat, async_op=True)))
        i += 1


@notebook
def hook_averaging_twice(ddp, param):
    hook(ddp, param, divide=True)


@notebook
def hook_flushing_early(ddp, param):
    hook(ddp, param, early=True)


def test_bucket_hook_check():
    expect_failure(check.bucket_hook, hook_averaging_twice, match="averaged once")
    expect_failure(check.bucket_hook, hook_flushing_early, match="before its last gradient")


# ---- 3. the ZeRO-1 step --------------------------------------------------------------------------

@notebook
def zero(opt, off_by_one=False, gather=True):
    opt.t += 1
    b1, b2 = opt.betas
    flat = torch.cat([q.reshape(-1) for q in opt.params])
    grad = torch.cat([q.grad.reshape(-1) for q in opt.params])
    lo = min(opt.rank * opt.shard, opt.numel)
    hi = min(lo + opt.shard - off_by_one, opt.numel)
    x, g = flat[lo:hi], grad[lo:hi]
    x *= 1 - opt.lr * opt.weight_decay
    opt.m.mul_(b1).add_((1 - b1) * g)
    opt.v.mul_(b2).add_((1 - b2) * g * g)
    x -= opt.lr * (opt.m / (1 - b1 ** opt.t)) / ((opt.v / (1 - b2 ** opt.t)).sqrt() + opt.eps)
    if gather:
        mine = torch.zeros(opt.shard, dtype=flat.dtype)
        mine[:hi - lo] = x
        pieces = [torch.empty_like(mine) for _ in range(opt.world_size)]
        dist.all_gather(pieces, mine)
        flat = torch.cat(pieces)
    else:
        flat[lo:hi] = x
    start = 0
    for q in opt.params:
        q.copy_(flat[start:start + q.numel()].view_as(q))
        start += q.numel()


@notebook
def zero_forgetting_bias_correction(opt):
    opt.t = 0   # t restarts at every step: the bias correction of step 1, every time
    zero(opt)


@notebook
def zero_shard_off_by_one(opt):
    zero(opt, off_by_one=True)


@notebook
def zero_without_all_gather(opt):
    zero(opt, gather=False)


def test_zero_step_check():
    expect_failure(check.zero_step, zero_shard_off_by_one, match="rank")
    expect_failure(check.zero_step, zero_forgetting_bias_correction, match="AdamW")


# ---- 4. the row-parallel forward -----------------------------------------------------------------

@notebook
def row_forward(x_slice, weight, bias, reduce_grad=False):
    class Sum(torch.autograd.Function):
        @staticmethod
        def forward(ctx, partial):
            out = partial.clone()
            dist.all_reduce(out)
            return out

        @staticmethod
        def backward(ctx, grad):
            if reduce_grad:
                grad = grad.clone()
                dist.all_reduce(grad)
            return grad

    return Sum.apply(x_slice @ weight.T) + bias


@notebook
def row_forward_without_all_reduce(x_slice, weight, bias):
    return x_slice @ weight.T + bias


@notebook
def row_forward_with_bias_before_the_sum(x_slice, weight, bias):
    return row_forward(x_slice, weight, bias, reduce_grad=False) + (dist.get_world_size() - 1) * bias


@notebook
def row_forward_reducing_in_backward_too(x_slice, weight, bias):
    return row_forward(x_slice, weight, bias, reduce_grad=True)


def test_row_parallel_check():
    expect_failure(check.row_parallel_forward, row_forward_without_all_reduce, match="partial sum")
    expect_failure(check.row_parallel_forward, row_forward_with_bias_before_the_sum, match="bias once")
