"""Checks for chapter 11, distributed training: the ring all-reduce, the bucketed gradient hook, the ZeRO-1
AdamW step and the row-parallel forward. Each check carries your function to fresh worker processes
(`Code.of`), runs it on every rank in float64, and compares what comes back with one process doing the
same work (the sum of every rank's tensor, training on the global batch, the whole MLP). The worker
functions below run inside those processes; the checks run in yours."""

import math

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.nn as nn
import torch.nn.functional as F

from course_lib.capture import defined_here
from course_lib.checks import CheckFailed, assert_close, exercise, fmt, require, rng
from course_lib.distributed.ddp import DDP
from course_lib.distributed.launch import Code, WorkerError, launch, resolve
from course_lib.distributed.tensor_parallel import ParallelMLP, RowParallelLinear
from course_lib.distributed.zero import ZeroAdamW
from course_lib.gpt.model import MLP, GPTConfig

TIMEOUT = 20   # seconds a rank may wait for a message before the run is stopped


def _carry(fn):
    """What reaches the workers: a notebook's function as source, an importable one as itself."""
    return Code.of(fn) if defined_here(fn) is not None else fn


def _run(world_size, worker, fn, **kwargs):
    """launch(worker) on world_size ranks; a failure in your code becomes a CheckFailed naming the rank."""
    __tracebackhide__ = True
    code = _carry(fn)
    try:
        return launch(worker, world_size, code, kwargs, timeout=TIMEOUT, wall_timeout=150)
    except WorkerError as e:
        if e.error.startswith("NotImplementedError"):
            raise NotImplementedError from None
        lines = [f"your code failed on rank {e.rank} of {world_size}: {e.error}"]
        if isinstance(code, Code):
            lines += _your_frames(e, code)
        if "timed out" in str(e).lower() or "timeout" in e.error.lower():
            lines.append(f"  hint: a rank waited {TIMEOUT} s for a message that never came: every send needs the "
                         "matching recv on the other rank, and two ranks that both wait to receive first never "
                         "meet (post the send with isend, then receive, then wait)")
        raise CheckFailed("\n".join(lines)) from None


def _your_frames(error, code):
    """The lines of your code in the failing rank's traceback ("File "<name>", line n"), with their text."""
    text, out = code.text.splitlines(), []
    for line in error.args[0].splitlines():
        line = line.strip()
        if line.startswith("File \"<") and ", line " in line:
            n = int(line.split(", line ")[1].split(",")[0])
            if 0 < n <= len(text):
                out.append(f"  in your code, line {n}: {text[n - 1].strip()}")
    return out[-3:]


def _worker(code, kwargs):
    """What each rank runs: the job named in kwargs, on your code."""
    job = kwargs.pop("job")
    return globals()[job](resolve(code), **kwargs)


# ---- 1. the ring all-reduce ------------------------------------------------------------------------

def ring_tensor(shape, rank, seed):
    g = torch.Generator().manual_seed(seed * 1_009 + rank * 31 + int(np.prod(shape)))
    return torch.randn(shape, generator=g, dtype=torch.float64)


class _Watch:
    """Record every message this rank sends or receives, and forbid the collectives that would do the work."""

    def __init__(self):
        self.sent, self.received = [], []
        isend, irecv = c10d.isend, c10d.irecv

        def watched_isend(tensor, dst=None, group=None, tag=0, group_dst=None):
            self.sent.append((dst if dst is not None else group_dst, tensor.numel()))
            return isend(tensor, dst, group, tag, group_dst)

        def watched_irecv(tensor, src=None, group=None, tag=0, group_src=None):
            self.received.append((src if src is not None else group_src, tensor.numel()))
            return irecv(tensor, src, group, tag, group_src)

        # send and recv call isend and irecv, and batch_isend_irecv checks its ops against them: patch both homes
        for home in (c10d, dist):
            home.isend, home.irecv = watched_isend, watched_irecv
        for name in ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather",
                     "all_gather_into_tensor", "broadcast", "gather", "scatter", "all_to_all"):
            setattr(dist, name, self._forbidden(name))

    @staticmethod
    def _forbidden(name):
        def call(*args, **kwargs):
            raise RuntimeError(f"dist.{name} is off limits here: build the all-reduce from send and recv "
                               "(or isend and irecv) to your neighbours")
        return call


def _ring_job(ring, shapes, seed):
    watch, out = _Watch(), []
    for shape in shapes:
        x = ring_tensor(shape, dist.get_rank(), seed)
        start_sent, start_received = len(watch.sent), len(watch.received)
        returned = ring(x)
        out.append({"tensor": x, "returned": returned if isinstance(returned, torch.Tensor) else type(returned).__name__,
                    "sent": watch.sent[start_sent:], "received": watch.received[start_received:]})
    return out


@exercise
def ring_all_reduce(your_ring_all_reduce):
    """Your ring on 3 processes against the sum of the ranks' tensors: in place, through neighbours only,
    sending no more than a ring does."""
    p, seed = 3, int(rng().integers(1 << 30))
    shapes = [(7,), (4, 5), (int(rng().integers(1, 40)) * 3 + 1,), (int(rng().integers(2, 9)), 7), (2,)]
    per_rank = _run(p, _worker, your_ring_all_reduce, job="_ring_job", shapes=shapes, seed=seed)
    for i, shape in enumerate(shapes):
        n = int(np.prod(shape))
        mine = [ring_tensor(shape, r, seed) for r in range(p)]
        expected = sum(mine)
        for rank in range(p):
            case = per_rank[rank][i]
            what = f"rank {rank}'s tensor of shape {shape} after your ring"
            returned = case["returned"]
            if isinstance(returned, torch.Tensor) and not torch.equal(returned, case["tensor"]):
                require(not torch.allclose(returned, expected), f"{what} was not changed in place: your function "
                        "returned the sum in a new tensor", hint="like dist.all_reduce, write the sum into the tensor "
                        "you were given (its chunks are views of it: += and copy_ write through)")
            held = torch.tensor_split(case["tensor"].reshape(-1), p)
            done = [c for c, (a, b) in enumerate(zip(held, torch.tensor_split(expected.reshape(-1), p)))
                    if torch.allclose(a, b, rtol=1e-10, atol=1e-12)]
            if 0 < len(done) < p and n >= p:
                raise CheckFailed(f"{what}: only chunk(s) {done} of {p} hold the complete sum\n"
                                  "  hint: after the reduce-scatter each rank holds one complete chunk; the all-gather "
                                  "(p - 1 more steps) carries the completed chunks around the ring")
            assert_close(case["tensor"], expected, what=what, rtol=1e-10, atol=1e-12,
                         inputs={f"rank {r}'s tensor": t for r, t in enumerate(mine)},
                         mistakes={"all-reduce sums, it does not average: no division by the world size": expected / p})
            peers = sorted({r for r, _ in case["sent"]})
            require(len(peers) <= 1 and all((r - rank) % p in (1, p - 1) for r in peers),
                    f"rank {rank} sent to ranks {peers}: in a ring each rank sends to one neighbour only",
                    hint="send to (rank + 1) % p, receive from (rank - 1) % p; gathering on rank 0 makes its link "
                         "carry (p - 1) times the tensor")
            elements = sum(k for _, k in case["sent"])
            bound = 2 * (p - 1) * math.ceil(n / p)
            require(elements <= bound, f"rank {rank} sent {elements} numbers for a tensor of {n}: a ring sends "
                    f"2(p - 1) chunks of about n/p numbers, at most {bound} here",
                    hint="send one chunk per step, not the whole tensor")
    return "5 shapes on 3 ranks, lengths not multiples of 3"


# ---- 2. the bucketed gradient hook -----------------------------------------------------------------

def mlp(sizes, seed):
    torch.manual_seed(seed)
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1]).double()


def batch(step, rows, sizes, seed):
    g = torch.Generator().manual_seed(seed * 7_919 + step)
    return (torch.randn(rows, sizes[0], generator=g, dtype=torch.float64),
            torch.randn(rows, sizes[-1], generator=g, dtype=torch.float64))


def mine(t):
    return t.tensor_split(dist.get_world_size())[dist.get_rank()]


def train(model, opt, steps, rows, sizes, seed, finish=lambda: None, wrap=None):
    """Train on the global batch (one process) or on this rank's slice of it (wrap: the DDP)."""
    for step in range(steps):
        x, y = batch(step, rows, sizes, seed)
        if wrap is not None:
            x, y = mine(x), mine(y)
        opt.zero_grad()
        F.mse_loss((wrap or model)(x), y).backward()
        finish()
        opt.step()
    return [t.detach().clone() for t in model.parameters()]


def _ddp_job(hook, cases, steps, rows, seed):
    results = []
    for sizes, bucket_bytes in cases:
        events = []

        class YourHook(DDP):
            def _grad_ready(self, p):
                self.landed.add(p)
                hook(self, p)
                leading = 0   # buckets that may go: complete, and all those before them complete
                while leading < len(self.buckets) and all(q in self.landed for q in self.buckets[leading]):
                    leading += 1
                events.append((len(self.inflight), leading, [i for i, *_ in self.inflight]))

            def _launch(self, i):
                events.append(("course launch", i))
                super()._launch(i)

            def _reset(self):
                super()._reset()
                self.landed = set()

        model = mlp(sizes, seed + dist.get_rank())   # different on each rank: the broadcast must fix that
        ddp = YourHook(model, bucket_bytes)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        params = train(model, opt, steps, rows, sizes, seed, ddp.finish, ddp)
        results.append({"params": params, "events": events, "buckets": len(ddp.buckets)})
    return results


@exercise
def bucket_hook(your_bucket_hook):
    """Your hook inside the course's DDP on 2 processes: buckets sent as soon as they (and those before them)
    are complete, never before, and the training equal to one process on the global batch."""
    p, seed, steps = 2, int(rng().integers(1 << 20)), 3
    hidden = [int(h) for h in rng().integers(3, 12, 2)]
    sizes = [int(rng().integers(2, 7)), *hidden, int(rng().integers(1, 5))]
    cases = [(sizes, 0), (sizes, 300), (sizes, 2**20), (sizes, int(rng().integers(100, 600)))]
    rows = 2 * int(rng().integers(2, 5))
    per_rank = _run(p, _worker, your_bucket_hook, job="_ddp_job", cases=cases, steps=steps, rows=rows, seed=seed)
    model = mlp(sizes, seed)
    expected = train(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), steps, rows, sizes, seed)
    for (sizes, bucket_bytes), *results in zip(cases, *per_rank):
        where = f"layer sizes {sizes}, bucket_bytes={bucket_bytes}"
        for rank, result in enumerate(results):
            events = result["events"]
            require(not any(e[0] == "course launch" for e in events),
                    f"{where}: the course's DDP._launch was called; your hook should flatten the bucket and start "
                    "its all-reduce itself", hint="torch.cat of the gradients, then dist.all_reduce(flat, async_op=True)")
            for k, (sent, ready, order) in enumerate(events):
                require(sent <= ready, f"{where}, rank {rank}: after gradient {k + 1} landed, {sent} bucket(s) were "
                        f"sent but only {ready} were complete: a bucket went before its last gradient",
                        hint="a bucket may go when every one of its parameters has its gradient: compare the count "
                             "with the bucket's length")
                require(sent >= ready, f"{where}, rank {rank}: after gradient {k + 1} landed, {ready} bucket(s) were "
                        f"complete but only {sent} had been sent: send each one as soon as it may go, during "
                        "backward, so the network works while autograd does", hint="one gradient can complete "
                        "several buckets: keep sending while the next one in order is complete")
                require(order == list(range(len(order))), f"{where}, rank {rank}: buckets were sent in the order "
                        f"{order}; every rank must send them in the same fixed order, 0, 1, 2, ...",
                        hint="the next bucket to send is always len(ddp.inflight)")
            for name, yours, exp in zip([f"parameter {i}" for i in range(len(expected))], result["params"], expected):
                assert_close(yours, exp, what=f"{where}, rank {rank}: {name} after {steps} SGD steps", rtol=1e-9,
                             atol=1e-11, hint="the gradients must be summed over the ranks and averaged once (the "
                             "course's finish() divides by the world size: your hook must not divide too)")
    return "4 bucket sizes, random layer sizes, 2 ranks against one process"


# ---- 3. the ZeRO-1 AdamW step ----------------------------------------------------------------------

HYPER = dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)


def _zero_job(your_step, cases, steps, rows, seed):
    class YourStep(ZeroAdamW):
        @torch.no_grad()
        def step(self):
            your_step(self)

    results = []
    for sizes in cases:
        model = mlp(sizes, seed)
        ddp = DDP(model)
        opt = YourStep(model.parameters(), **HYPER)
        params = train(model, opt, steps, rows, sizes, seed, ddp.finish, ddp)
        results.append({"params": params, "t": opt.t, "state": (opt.m.numel(), opt.v.numel())})
    return results


@exercise
def zero_step(your_zero_step):
    """Your sharded AdamW step on 2 processes, after the course's DDP, against torch.optim.AdamW in one process."""
    p, seed, steps = 2, int(rng().integers(1 << 20)), 3
    cases = []
    while len(cases) < 3:
        sizes = [int(s) for s in rng().integers(2, 8, 3)]
        if sum(a * b + b for a, b in zip(sizes, sizes[1:])) % p:
            cases.append(sizes)   # N odd: the last shard is shorter
    cases[0] = [3, 4, 3]          # N = 31: shards of 16 and 15
    rows = 2 * int(rng().integers(1, 4))
    per_rank = _run(p, _worker, your_zero_step, job="_zero_job", cases=cases, steps=steps, rows=rows, seed=seed)
    for sizes, *results in zip(cases, *per_rank):
        model = mlp(sizes, seed)
        expected = train(model, torch.optim.AdamW(model.parameters(), **HYPER), steps, rows, sizes, seed)
        n = sum(t.numel() for t in expected)
        first = torch.cat([t.reshape(-1) for t in results[0]["params"]])
        for rank, result in enumerate(results[1:], 1):
            require(torch.equal(torch.cat([t.reshape(-1) for t in result["params"]]), first),
                    f"layer sizes {sizes}: after {steps} steps rank {rank}'s parameters differ from rank 0's",
                    hint="each rank updates its own shard, then every rank must receive every updated shard "
                         "(the all-gather) and write them all into its parameters")
        for rank, result in enumerate(results):
            require(result["t"] == steps, f"after {steps} steps opt.t is {result['t']}: count the steps (AdamW's "
                    "bias correction uses t)")
            yours, exp = torch.cat([t.reshape(-1) for t in result["params"]]), torch.cat([t.reshape(-1) for t in expected])
            lo = min(rank * math.ceil(n / p), n)
            hi = min(lo + math.ceil(n / p), n)
            bad = (yours - exp).abs() > 1e-9 * (1 + exp.abs())
            if bad.any():
                first = int(bad.nonzero()[0])
                owner = first // math.ceil(n / p)
                hint = ("this number belongs to rank {}'s shard [{}, {}) of the flat vector".format(
                    owner, *(min(b, n) for b in (owner * math.ceil(n / p), (owner + 1) * math.ceil(n / p)))))
                if not lo <= first < hi:
                    hint += f"; this rank ({rank}) updates [{lo}, {hi}) and gets the rest from the all-gather"
                raise CheckFailed(f"layer sizes {sizes} (N = {n} numbers, shards of {math.ceil(n / p)}), rank {rank}: "
                                  f"the parameters after {steps} steps differ from torch.optim.AdamW's {HYPER}\n"
                                  f"  first bad number {first}: yours {fmt(float(yours[first]))}, "
                                  f"expected {fmt(float(exp[first]))}\n  {int(bad.sum())} of {n} numbers differ\n"
                                  f"  hint: {hint}")
    return "3 random models, N odd, 2 ranks against torch.optim.AdamW"


# ---- 4. the row-parallel forward -------------------------------------------------------------------

def tp_case(n_embd, rows, seq, seed):
    torch.manual_seed(seed)
    layer = MLP(GPTConfig(n_embd=n_embd)).double()
    x = torch.randn(rows, seq, n_embd, dtype=torch.float64)
    weight = torch.randn(rows, seq, n_embd, dtype=torch.float64)
    return layer, x, weight


def _tp_job(forward, cases):
    class YourRow(RowParallelLinear):
        def forward(self, x_slice):
            return forward(x_slice, self.weight, self.bias)

    results = []
    for n_embd, rows, seq, seed in cases:
        layer, x, weight = tp_case(n_embd, rows, seq, seed)
        tp = ParallelMLP(layer, row=YourRow)
        x.requires_grad_(True)
        out = tp(x)
        require(isinstance(out, torch.Tensor), f"row_parallel_forward returned {type(out).__name__}, not a tensor")
        (out * weight).sum().backward()
        grads = [(t.grad.clone() if t.grad is not None else None) for t in
                 (tp.c_fc.weight, tp.c_fc.bias, tp.c_proj.weight, tp.c_proj.bias)]
        results.append({"out": out.detach(), "x.grad": x.grad.clone(), "grads": grads,
                        "slices": ((tp.c_fc.lo, tp.c_fc.hi), (tp.c_proj.lo, tp.c_proj.hi))})
    return results


@exercise
def row_parallel_forward(your_row_parallel_forward):
    """Your row-parallel forward in the GPT's MLP split over 3 processes, against the whole MLP in one process:
    the output, the input's gradient and every rank's weight-slice gradients."""
    p = 3
    cases = [(4, 1, 1, 0)] + [(int(c), int(r), int(s), int(rng().integers(1 << 20)))   # 4C never a multiple of 3
                              for c, r, s in zip(rng().choice([5, 7, 8, 10, 11], 3), rng().integers(1, 4, 3),
                                                 rng().integers(1, 6, 3))]
    per_rank = _run(p, _worker, your_row_parallel_forward, job="_tp_job", cases=cases)
    for (n_embd, rows, seq, seed), *results in zip(cases, *per_rank):
        layer, x, weight = tp_case(n_embd, rows, seq, seed)
        x.requires_grad_(True)
        out = layer(x)
        (out * weight).sum().backward()
        hidden = F.gelu(layer.c_fc(x), approximate="tanh").detach()
        where = f"n_embd={n_embd}, x of shape {tuple(x.shape)}"
        for rank, result in enumerate(results):
            _, (lo, hi) = result["slices"]
            partial = hidden[..., lo:hi] @ layer.c_proj.weight[:, lo:hi].T.detach()
            assert_close(result["out"], out.detach(), what=f"{where}: rank {rank}'s output", rtol=1e-9, atol=1e-11,
                         mistakes={"each rank holds a partial sum of the output: add them over the ranks (an "
                                   "all-reduce, in an autograd Function: that is g)": partial + layer.c_proj.bias.detach(),
                                   "add the bias once, after the sum: added before the all-reduce, it counts p times":
                                       out.detach() + (p - 1) * layer.c_proj.bias.detach()})
            fc_w, fc_b, proj_w, proj_b = result["grads"]
            require(fc_w is not None and proj_w is not None, f"{where}: rank {rank}'s weights got no gradient",
                    hint="the all-reduce must sit inside an autograd Function, whose backward returns the gradient")
            assert_close(proj_w, layer.c_proj.weight.grad[:, lo:hi], what=f"{where}: rank {rank}'s c_proj weight "
                         "gradient (its columns)", rtol=1e-9, atol=1e-11,
                         mistakes={"g's backward is the identity: every rank's partial sum feeds the output with "
                                   "weight 1, so its gradient is the output's, not summed again":
                                       p * layer.c_proj.weight.grad[:, lo:hi]})
            c_lo, c_hi = result["slices"][0]
            assert_close(fc_w, layer.c_fc.weight.grad[c_lo:c_hi], what=f"{where}: rank {rank}'s c_fc weight gradient",
                         rtol=1e-9, atol=1e-11)
            assert_close(proj_b, layer.c_proj.bias.grad, what=f"{where}: rank {rank}'s c_proj bias gradient",
                         rtol=1e-9, atol=1e-11)
            assert_close(result["x.grad"], x.grad, what=f"{where}: rank {rank}'s gradient of x", rtol=1e-9, atol=1e-11)
    return "4 MLPs on 3 ranks: output, input and weight gradients"
