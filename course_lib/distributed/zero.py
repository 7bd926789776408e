"""ZeRO stage 1 around any optimizer: its state is split across the ranks instead of copied on each.

This file is the course's answer to exercise 11.3: read it once your check passes.

Data parallelism keeps p identical copies of everything. AdamW's two moments (m and v) are as large
as the parameters together, so in float32 training with float32 state the optimizer alone takes twice
the model's memory on every rank. But after the gradient all-reduce every rank would compute the same
update: it is enough that each rank updates 1/p of the parameters and sends its slice to the others.

Lay all parameters end to end in one flat vector of N numbers and cut it into p shards of ceil(N/p)
(the last ones shorter, or empty when N is small). Rank r keeps its shard as one tensor of its own and
hands that tensor, and only it, to the optimizer: the optimizer's state is then that of the shard,
1/p of the whole. Any optimizer whose update is elementwise (SGD with momentum, Adam, AdamW, RMSprop,
Adagrad...) updates a shard exactly as it would update those numbers in the whole model. After the
step an all-gather puts the updated shards back together on every rank. The cost: one all-gather of
N numbers per step. Another split deals whole tensors out, each to the rank that holds the fewest
numbers so far (PyTorch's ZeroRedundancyOptimizer does so): no tensor is cut, and each rank's share is
N/p give or take one tensor. (ZeRO-2 also shards the gradients, with a reduce-scatter in place of the
all-reduce; ZeRO-3 the parameters themselves.)
"""

import math

import torch
import torch.distributed as dist


class ZeroOptimizer:
    """The course's answer to exercise 11.3 (`zero_optimizer`): read it once your check passes.

    `optimizer_class(params, **defaults)`'s update, with its state sharded over the ranks.

    Call step() after the gradients have been averaged over the ranks (after DDP.finish()).
    """

    def __init__(self, params, optimizer_class, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / self.world_size)
        self.lo, self.hi = self.bounds(self.rank)
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.shard = flat[self.lo:self.hi].clone().requires_grad_(True)   # a leaf of its own: this rank's slice
        self.optimizer = optimizer_class([self.shard], **defaults)
        self.param_groups = self.optimizer.param_groups                  # so a learning-rate schedule can reach lr

    def bounds(self, rank):
        """[lo, hi) of the flat parameter vector that `rank` updates."""
        lo = min(rank * self.shard_size, self.numel)
        return lo, min(lo + self.shard_size, self.numel)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params])
        self.shard.grad = grad[self.lo:self.hi]
        self.optimizer.step()
        # every rank sends its updated shard (padded to the common length) and receives everyone's
        mine = self.shard.new_zeros(self.shard_size)
        mine[:self.hi - self.lo] = self.shard
        flat = self.shard.new_empty(self.shard_size * self.world_size)
        dist.all_gather(list(flat.tensor_split(self.world_size)), mine)   # views of flat: written in place
        offset = 0
        for p in self.params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

