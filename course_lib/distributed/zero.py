"""ZeRO stage 1: AdamW whose state is split across the ranks instead of copied on each.

Data parallelism keeps p identical copies of everything. AdamW's two moments (m and v) are as large
as the parameters together, so in float32 training with float32 state the optimizer alone takes twice
the model's memory on every rank. But after the gradient all-reduce every rank would compute the same
update: it is enough that each rank updates 1/p of the parameters and sends its slice to the others.

Lay all parameters end to end in one flat vector of N numbers and cut it into p shards of
ceil(N/p) (the last one padded, since all_gather wants equal pieces). Rank r keeps m and v for shard r
only, 2·ceil(N/p) numbers instead of 2N, updates that shard, and an all-gather puts the updated shards
back together on every rank. The result is exactly AdamW's; what it costs is one all-gather of N
numbers per step. (ZeRO-2 also shards the gradients, with a reduce-scatter in place of the all-reduce;
ZeRO-3 the parameters themselves.)
"""

import math

import torch
import torch.distributed as dist


class ZeroAdamW:
    """torch.optim.AdamW's update (one parameter group) with m and v sharded over the ranks.

    Call it after the gradients have been averaged over the ranks (after DDP.finish()).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.numel = sum(p.numel() for p in self.params)
        self.shard = math.ceil(self.numel / self.world_size)
        lo, hi = self.bounds(self.rank)
        self.m = self.params[0].new_zeros(hi - lo)   # first moment, this rank's shard only
        self.v = self.params[0].new_zeros(hi - lo)   # second moment
        self.t = 0

    def bounds(self, rank):
        """[lo, hi) of the flat parameter vector that `rank` updates."""
        lo = min(rank * self.shard, self.numel)
        return lo, min(lo + self.shard, self.numel)

    def state_bytes(self):
        """The optimizer state this rank holds."""
        return (self.m.numel() + self.v.numel()) * self.m.element_size()

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        self.t += 1
        flat = torch.cat([p.reshape(-1) for p in self.params])
        grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params])
        lo, hi = self.bounds(self.rank)
        self._adamw(flat[lo:hi], grad[lo:hi])
        # every rank sends its updated shard (padded to the common length) and receives everyone's
        mine = flat.new_zeros(self.shard)
        mine[:hi - lo] = flat[lo:hi]
        shards = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(shards, mine)
        for r, shard in enumerate(shards):
            a, b = self.bounds(r)
            flat[a:b] = shard[:b - a]
        offset = 0
        for p in self.params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def _adamw(self, x, g):
        """AdamW on one shard, in place, in the same order of operations as torch.optim.AdamW."""
        beta1, beta2 = self.betas
        x.mul_(1 - self.lr * self.weight_decay)   # decoupled weight decay
        self.m.lerp_(g, 1 - beta1)
        self.v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        step_size = self.lr / (1 - beta1 ** self.t)
        denom = (self.v.sqrt() / math.sqrt(1 - beta2 ** self.t)).add_(self.eps)
        x.addcdiv_(self.m, denom, value=-step_size)
