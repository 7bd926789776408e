"""Tensor parallelism for the GPT's MLP: each rank holds a slice of both matrices (as Megatron-LM does).

This file is the course's answer to exercises 11.4 and 11.5: read it once your checks pass.

The MLP computes gelu(x A^T + a) B^T + b with A: (4C, C) and B: (C, 4C). Split A by rows (its output
features, "column-parallel" in Megatron's x·A convention): rank r computes its own slice of the 4C hidden
features, and gelu, elementwise, needs nothing from the others. Split B by columns ("row-parallel"):
rank r multiplies its hidden slice by its columns of B, a partial sum of the output. One all-reduce adds
the partial sums; the bias b is added once, after it. Each rank stores 1/p of the weights, and the
whole MLP costs one all-reduce forward.

Backward mirrors it. The all-reduce's backward is the identity (each partial sum feeds the output with
weight 1), but x entered every rank's slice, so x's gradient is the sum of the ranks' contributions:
an all-reduce in backward. Two autograd Functions say this, Megatron's f and g:

    f = CopyToParallel:     forward identity,    backward all-reduce
    g = ReduceFromParallel: forward all-reduce,  backward identity

A bare dist.all_reduce in the forward would give the right numbers here, but autograd would not know
of it: nothing would say what its gradient is, and a tensor it changed in place might be one autograd
saved. As Functions, both collectives are part of the graph, with their gradients beside them.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class CopyToParallel(torch.autograd.Function):
    """The course's answer to exercise 11.4 (`f_and_g`): read it once your check passes.

    f: the input goes to every rank's slice unchanged; their gradients add up."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromParallel(torch.autograd.Function):
    """The course's answer to exercise 11.4 (`f_and_g`): read it once your check passes.

    g: the ranks' partial sums add up (in a copy: the input may be saved by autograd); the gradient passes."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def my_slice(n, rank, world_size):
    """The course's answer to exercise 11.5 (`parallel_mlp`): read it once your check passes.

    The [lo, hi) of n features that `rank` holds: torch.tensor_split's pieces (sizes differ by at most 1)."""
    lo = rank * (n // world_size) + min(rank, n % world_size)
    return lo, lo + n // world_size + (rank < n % world_size)


class ParallelMLP(nn.Module):
    """The course's answer to exercise 11.5 (`parallel_mlp`): read it once your check passes.

    course_lib.gpt.model.MLP split over the ranks: column-parallel c_fc, gelu, row-parallel c_proj.

    f and g are class attributes, so a subclass can bring its own (as `train.tensor_parallel` does)."""

    f, g = CopyToParallel, ReduceFromParallel

    def __init__(self, mlp):
        super().__init__()
        rank, p = dist.get_rank(), dist.get_world_size()
        self.lo, self.hi = my_slice(mlp.c_fc.out_features, rank, p)
        fc, proj = mlp.c_fc, mlp.c_proj
        self.c_fc = self.linear(fc.weight.detach()[self.lo:self.hi], fc.bias.detach()[self.lo:self.hi])   # rows of A
        self.c_proj = self.linear(proj.weight.detach()[:, self.lo:self.hi], proj.bias.detach())          # columns of B; b whole
        self.dropout = mlp.dropout   # after g: every rank must draw the same mask (same seed on every rank)

    @staticmethod
    def linear(weight, bias):
        """An nn.Linear holding copies of the given weight (out, in) and bias: parameters of this rank's own."""
        layer = nn.Linear(weight.shape[1], weight.shape[0], dtype=weight.dtype, device=weight.device)
        with torch.no_grad():
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)
        return layer

    def forward(self, x):
        hidden = F.gelu(self.c_fc(self.f.apply(x)), approximate="tanh")   # (B, T, this rank's 4C/p)
        partial = F.linear(hidden, self.c_proj.weight)                    # (B, T, C), one rank's share
        return self.dropout(self.g.apply(partial) + self.c_proj.bias)
