"""Tensor parallelism for the GPT's MLP: each rank holds a slice of both matrices (as Megatron-LM does).

The MLP computes gelu(x A^T + a) B^T + b with A: (4C, C) and B: (C, 4C). Split A by rows (its output
features, "column-parallel" in Megatron's x·A convention): rank r computes its own slice of the 4C hidden
features, and gelu, elementwise, needs nothing from the others. Split B by columns ("row-parallel"):
rank r multiplies its hidden slice by its columns of B, a partial sum of the output. One all-reduce adds
the partial sums; the bias b is added once, after it. Each rank stores 1/p of the weights, and the
whole MLP costs one all-reduce forward.

Backward mirrors it. The all-reduce's backward is the identity (each partial sum feeds the output with
weight 1), but x entered every rank's slice, so x's gradient is the sum of the ranks' contributions:
an all-reduce in backward. Two autograd Functions say this, Megatron's f and g:

    f = copy_to_parallel:     forward identity,    backward all-reduce
    g = reduce_from_parallel: forward all-reduce,  backward identity
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class CopyToParallel(torch.autograd.Function):
    """f: the input goes to every rank's slice unchanged; their gradients add up."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromParallel(torch.autograd.Function):
    """g: the ranks' partial sums add up; each receives the output's gradient unchanged."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


copy_to_parallel = CopyToParallel.apply
reduce_from_parallel = ReduceFromParallel.apply


def my_slice(n, rank, world_size):
    """The [lo, hi) of n features that `rank` holds (sizes differ by at most 1 when p does not divide n)."""
    lo = rank * (n // world_size) + min(rank, n % world_size)
    return lo, lo + n // world_size + (rank < n % world_size)


class ColumnParallelLinear(nn.Module):
    """This rank's rows of `linear` (a slice of its output features); the input arrives through f."""

    def __init__(self, linear, rank, world_size):
        super().__init__()
        self.lo, self.hi = my_slice(linear.out_features, rank, world_size)
        self.weight = nn.Parameter(linear.weight.detach()[self.lo:self.hi].clone())
        self.bias = nn.Parameter(linear.bias.detach()[self.lo:self.hi].clone())

    def forward(self, x):
        return F.linear(copy_to_parallel(x), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's columns of `linear` (a slice of its input features); partial sums meet in g."""

    def __init__(self, linear, rank, world_size):
        super().__init__()
        self.lo, self.hi = my_slice(linear.in_features, rank, world_size)
        self.weight = nn.Parameter(linear.weight.detach()[:, self.lo:self.hi].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())   # whole, added once after the sum

    def forward(self, x_slice):
        return reduce_from_parallel(F.linear(x_slice, self.weight)) + self.bias


class ParallelMLP(nn.Module):
    """course_lib.gpt.model.MLP split over the ranks: column-parallel c_fc, gelu, row-parallel c_proj."""

    def __init__(self, mlp, column=ColumnParallelLinear, row=RowParallelLinear):
        super().__init__()
        rank, p = dist.get_rank(), dist.get_world_size()
        self.c_fc = column(mlp.c_fc, rank, p)
        self.c_proj = row(mlp.c_proj, rank, p)
        self.dropout = mlp.dropout   # a real run would seed it alike on all ranks after c_proj

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))
