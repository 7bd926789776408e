"""Checks for chapter 11, distributed training: the ring all-reduce, the DDP container, the ZeRO-1 wrapper,
Megatron's f and g, and the tensor-parallel MLP.

Each check carries your code to fresh worker processes (as source text, `launch.carry`), runs it on every
rank in float64, and compares what comes back with one process doing the same work (the sum of every
rank's tensor, training on the global batch, the whole MLP). It also watches *how* your code gets there:
the messages your ring sends, when your DDP sends each bucket during backward, how much optimizer state
each rank keeps, which autograd Functions your MLP's graph holds. Values right and the property wrong
(no overlap, full-size state, a collective autograd cannot see) fails too.

World sizes: each check runs at the world size in its docstring; COURSE_WORLD_SIZES="2,3,4" runs them all
(the opt-in sweep does). The worker functions below (`_..._job`) run inside the workers; the checks run
in your process.
"""

import contextlib
import math
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.nn as nn
import torch.nn.functional as F

from course_lib.checks import CheckFailed, assert_close, exercise, fmt, require, rng
from course_lib.distributed.launch import Code, WorkerError, carry, launch, preload, resolve
from course_lib.gpt.model import MLP, GPTConfig

TIMEOUT = 30   # seconds a rank may wait for a message before the run is stopped
preload(__name__)   # the workers run the jobs below: forked with this module already imported


def world_sizes(default):
    """The world sizes to run a check at: `default`, or those listed in COURSE_WORLD_SIZES ("2,3,4")."""
    chosen = os.environ.get("COURSE_WORLD_SIZES")
    return tuple(int(p) for p in chosen.split(",")) if chosen else default


def _run(world_size, job, your_code, **kwargs):
    """Run `job` on your code at world_size ranks; a failure in your code becomes a CheckFailed naming the rank."""
    __tracebackhide__ = True
    codes = [carry(c) for c in your_code]
    try:
        return launch(_worker, world_size, job, codes, kwargs, timeout=TIMEOUT, wall_timeout=150)
    except WorkerError as e:
        if e.error.startswith("NotImplementedError"):
            raise NotImplementedError from None
        lines = [f"your code failed on rank {e.rank} of {world_size}: {e.error}"]
        lines += _your_frames(e, [c for c in codes if isinstance(c, Code)])
        if "timed out" in str(e).lower() or "timeout" in e.error.lower():
            lines.append(f"  hint: a rank waited {TIMEOUT} s for a message that never came: every send needs the "
                         "matching recv on the other rank, every rank must call each collective, in the same order, "
                         "and two ranks that both wait to receive first never meet (post the send with isend, then "
                         "receive, then wait)")
        raise CheckFailed("\n".join(lines)) from None


def _your_frames(error, codes):
    """The lines of your code in the failing rank's traceback ("File "<name>", line n"), with their text."""
    out = []
    for line in error.args[0].splitlines():
        line = line.strip()
        for code in codes:
            if line.startswith(f'File "{code.filename}", line '):
                n = int(line.split(", line ")[1].split(",")[0])
                text = code.text.splitlines()
                if 0 < n <= len(text):
                    out.append(f"  in your code, line {n}: {text[n - 1].strip()}")
    return out[-3:]


def _worker(job, codes, kwargs):
    """What each rank runs: the job, on your code (which each job loads inside its instruments, so that even
    a `from torch.distributed import ...` of yours goes through them)."""
    return globals()[job](*codes, **kwargs)


def _flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


@contextlib.contextmanager
def _patched(module, **replacements):
    """Swap attributes of a module inside the worker for the length of a job (the checks' instruments)."""
    saved = {name: getattr(module, name) for name in replacements}
    for name, value in replacements.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


# ---- 1. the ring all-reduce ------------------------------------------------------------------------

def ring_tensor(shape, rank, seed):
    g = torch.Generator().manual_seed(seed * 1_009 + rank * 31 + int(np.prod(shape)))
    return torch.randn(shape, generator=g, dtype=torch.float64)


COLLECTIVES = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather",
               "all_gather_into_tensor", "all_gather_object", "broadcast", "gather", "scatter", "all_to_all")


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
        self.patches = contextlib.ExitStack()
        for home in (c10d, dist):
            self.patches.enter_context(_patched(home, isend=watched_isend, irecv=watched_irecv))
        self.patches.enter_context(_patched(dist, **{name: self._forbidden(name) for name in COLLECTIVES}))

    @staticmethod
    def _forbidden(name):
        def call(*args, **kwargs):
            raise RuntimeError(f"dist.{name} is off limits here: build the all-reduce from send and recv "
                               "(or isend and irecv) to your neighbours")
        return call


def _ring_job(ring, shapes, seed):
    watch, out = _Watch(), []
    with watch.patches:
        ring = resolve(ring)
        for shape in shapes:
            x = ring_tensor(shape, dist.get_rank(), seed)
            start_sent = len(watch.sent)
            returned = ring(x)
            out.append({"tensor": x, "returned": returned if isinstance(returned, torch.Tensor) else type(returned).__name__,
                        "sent": watch.sent[start_sent:]})
    return out


def _check_ring(p, per_rank, shapes, seed):
    for i, shape in enumerate(shapes):
        n = int(np.prod(shape))
        mine = [ring_tensor(shape, r, seed) for r in range(p)]
        expected = sum(mine)
        for rank in range(p):
            case = per_rank[rank][i]
            what = f"{p} ranks, rank {rank}'s tensor of shape {shape} after your ring"
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
                    f"{p} ranks: rank {rank} sent to ranks {peers}: in a ring each rank sends to one neighbour only",
                    hint="send to (rank + 1) % p, receive from (rank - 1) % p; gathering on rank 0 makes its link "
                         "carry (p - 1) times the tensor")
            elements = sum(k for _, k in case["sent"])
            bound = 2 * (p - 1) * math.ceil(n / p)
            require(elements <= bound, f"{p} ranks: rank {rank} sent {elements} numbers for a tensor of {n}: a ring "
                    f"sends 2(p - 1) chunks of about n/p numbers, at most {bound} here",
                    hint="cut the tensor into p chunks and send one chunk per step, never the whole tensor: passing "
                         "whole tensors around the ring sends (p - 1)·n numbers, the chunked ring 2(p - 1)/p·n")
            require(len(case["sent"]) <= 2 * (p - 1), f"{p} ranks: rank {rank} sent {len(case['sent'])} messages for "
                    f"one all-reduce; the ring sends 2(p - 1) = {2 * (p - 1)}, one per step",
                    hint="each message costs a latency: one send per step, of one chunk")


@exercise
def ring_all_reduce(your_ring_all_reduce):
    """Your ring on 3 processes against the sum of the ranks' tensors: in place, through neighbours only,
    sending no more than a ring does; tensors with fewer numbers than ranks (empty chunks) included."""
    seed = int(rng().integers(1 << 30))
    shapes = [(7,), (1,), (2,), (4, 5), (int(rng().integers(1, 40)) * 3 + 1,), (int(rng().integers(2, 9)), 7)]
    ps = world_sizes((3,))
    for p in ps:
        per_rank = _run(p, "_ring_job", [your_ring_all_reduce], shapes=shapes, seed=seed)
        _check_ring(p, per_rank, shapes, seed)
    return f"6 shapes on {'/'.join(map(str, ps))} ranks, lengths 1 and 2 and not multiples of p"


# ---- 2. the DDP container ---------------------------------------------------------------------------

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


ACCUMULATE_AT = 1   # the step of the DDP check that runs two micro-batches, the first under no_sync


def expected_buckets(numels, bucket_bytes, itemsize=8):
    """Parameter indices of each bucket: the parameters in reverse order, a bucket closed once it holds
    at least bucket_bytes."""
    buckets, current, size = [], [], 0
    for i in reversed(range(len(numels))):
        current.append(i)
        size += numels[i] * itemsize
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def _ddp_job(DDP, cases, steps, rows, seed):
    rank, results = dist.get_rank(), []
    log = []
    all_reduce = dist.all_reduce

    def watched_all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        log.append(("all_reduce", tensor.numel(), bool(async_op)))
        return all_reduce(tensor, op=op, group=group, async_op=async_op)

    with _patched(dist, all_reduce=watched_all_reduce), _patched(c10d, all_reduce=watched_all_reduce):
        DDP = resolve(DDP)
        for sizes, bucket_bytes in cases:
            log.clear()
            model = mlp(sizes, seed + rank)   # different on each rank: the broadcast must fix that
            params = list(model.parameters())
            for i, t in enumerate(params):   # registered before yours, so it runs first for each parameter
                t.register_post_accumulate_grad_hook(lambda _, i=i: log.append(("landed", i)))
            ddp = DDP(model, bucket_bytes)
            start = [t.detach().clone() for t in params]
            opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
            for step in range(steps):
                x, y = (mine(t) for t in batch(step, rows, sizes, seed))
                opt.zero_grad()
                halves = list(zip(x.tensor_split(2), y.tensor_split(2))) if step == ACCUMULATE_AT else [(x, y)]
                for k, (xk, yk) in enumerate(halves):
                    syncing = k == len(halves) - 1
                    log.append(("backward", step, syncing))
                    with ddp.no_sync() if not syncing else contextlib.nullcontext():
                        (F.mse_loss(ddp(xk), yk) / len(halves)).backward()
                    log.append(("backward returned",))
                ddp.finish()
                log.append(("finish returned",))
                opt.step()
            results.append({"start": start, "params": [t.detach().clone() for t in params], "log": list(log)})
    return results


def _train_one_process(sizes, seed, steps, rows, lr):
    model = mlp(sizes, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        x, y = batch(step, rows, sizes, seed)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return [t.detach() for t in model.parameters()]


def _check_overlap(where, log, buckets, numels):
    """Walk one rank's log: every backward outside no_sync sends each bucket, asynchronously, as soon as it
    and the buckets before it are complete; a backward inside no_sync sends nothing."""
    sizes = [sum(numels[i] for i in b) for b in buckets]
    k = 0
    while k < len(log):
        event = log[k]
        if event[0] != "backward":
            k += 1
            continue
        _, step, syncing = event
        end = log.index(("backward returned",), k)
        segment = log[k + 1:end]
        sends = [e for e in segment if e[0] == "all_reduce"]
        what = f"{where}, step {step}"
        if not syncing:
            require(not sends, f"{what}: the backward inside `with ddp.no_sync():` started {len(sends)} all-reduce(s)",
                    hint="inside no_sync the gradients only accumulate in .grad; the first backward after it sends "
                         "their sums (and must count its gradients from zero)")
            k = end + 1
            continue
        require(sends, f"{what}: no bucket was sent during backward ({len(buckets)} bucket(s), all complete by the "
                "end of it)" + (": the all-reduces came later" if step == 0 else ", though an earlier step's were"),
                hint="send each bucket from the gradient hook as soon as its last gradient lands, so the "
                     "communication of the last layers overlaps the backward of the first ones; finish() only waits"
                     + ("" if step == 0 else ". If step 0 sent them, what you count per bucket was not started "
                        "afresh for this backward (after finish(), and not during no_sync)"))
        require([e[1] for e in sends] == sizes[:len(sends)] and len(sends) == len(sizes),
                f"{what}: your all-reduces carried {[e[1] for e in sends]} numbers, in that order; with these "
                f"parameters and bucket_bytes the buckets hold {sizes}",
                hint="walk the parameters in reverse order (the order backward produces their gradients) and close "
                     "a bucket as soon as it holds at least bucket_bytes bytes; send bucket 0, 1, 2, ... in that order, "
                     "each as one flat tensor")
        landed, sent = set(), 0
        for e in segment + [("end",)]:
            if e[0] == "all_reduce":
                require(e[2], f"{what}: bucket {sent}'s all-reduce blocked the backward (async_op=False)",
                        hint="start it with dist.all_reduce(flat, async_op=True) and keep the work; finish() waits")
                sent += 1
                continue
            ready = 0
            while ready < len(buckets) and all(i in landed for i in buckets[ready]):
                ready += 1
            after = f"after {len(landed)} of {len(numels)} gradients had landed"
            require(sent <= ready, f"{what}: {after}, {sent} bucket(s) had been sent but only {ready} were complete: "
                    "a bucket went before its last gradient", hint="a bucket may go when every one of its parameters "
                    "has its gradient: count the arrivals per bucket and compare with the bucket's length")
            require(sent >= ready, f"{what}: {after}, {ready} bucket(s) were complete but only {sent} had been sent",
                    hint="send each bucket as soon as it may go: one gradient can complete several buckets, so keep "
                         "sending while the next one in order is complete")
            if e[0] == "landed":
                landed.add(e[1])
        k = end + 1


@exercise
def ddp(your_DDP):
    """Your DDP on 2 processes, each rank starting from its own weights: broadcast, buckets (reverse order,
    by bytes) sent asynchronously during backward as soon as complete, finish() averaging once, no_sync()
    for gradient accumulation; the training equal to one process on the global batch."""
    seed, steps = int(rng().integers(1 << 20)), 3
    hidden = [int(h) for h in rng().integers(3, 12, 2)]
    sizes = [int(rng().integers(2, 7)), *hidden, int(rng().integers(1, 5))]
    cases = [(sizes, 0), (sizes, int(rng().integers(150, 600))), (sizes, 2**20)]
    ps = world_sizes((2,))
    for p in ps:
        rows = p * 2 * int(rng().integers(1, 4))   # equal slices, each cut in two micro-batches at step 1
        per_rank = _run(p, "_ddp_job", [your_DDP], cases=cases, steps=steps, rows=rows, seed=seed)
        first = [t.detach() for t in mlp(sizes, seed).parameters()]
        expected, summed, halved = (_train_one_process(sizes, seed, steps, rows, lr) for lr in (0.1, 0.1 * p, 0.1 / p))
        numels = [t.numel() for t in first]
        for (sizes, bucket_bytes), *results in zip(cases, *per_rank):
            where = f"{p} ranks, layer sizes {sizes}, bucket_bytes={bucket_bytes}"
            for rank, result in enumerate(results):
                for i, (yours, exp) in enumerate(zip(result["start"], first)):
                    require(torch.equal(yours, exp), f"{where}: right after DDP(model, ...), rank {rank}'s parameter "
                            f"{i} is not rank 0's (every rank built its model from its own seed)",
                            hint="in __init__, broadcast every parameter from rank 0 (dist.broadcast, under "
                                 "torch.no_grad()), so that all ranks start from the same weights")
            for rank, result in enumerate(results):
                _check_overlap(f"{where}, rank {rank}", result["log"], expected_buckets(numels, bucket_bytes), numels)
                for i, (yours, exp) in enumerate(zip(result["params"], expected)):
                    assert_close(yours, exp, what=f"{where}, rank {rank}: parameter {i} after {steps} SGD steps "
                                 "(one of them two micro-batches)", rtol=1e-9, atol=1e-11,
                                 mistakes={"the gradients were summed, not averaged: divide the sum by the world "
                                           "size once, in finish()": summed[i],
                                           "the gradients were divided by the world size twice: once is the mean":
                                               halved[i]})
    return f"3 bucket sizes, random layer sizes, {'/'.join(map(str, ps))} ranks against one process"


# ---- 3. the ZeRO-1 wrapper -------------------------------------------------------------------------

OPTIMIZERS = {
    "AdamW": (torch.optim.AdamW, dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)),
    "SGD": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    "Adam": (torch.optim.Adam, dict(lr=0.03, amsgrad=True, weight_decay=0.01)),
    "RMSprop": (torch.optim.RMSprop, dict(lr=0.01, momentum=0.5, centered=True)),
    "Adagrad": (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01)),
}


def state_numbers(optimizer):
    """The numbers an optimizer keeps in state tensors (its step counters, 0-dimensional, left out)."""
    return sum(t.numel() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0)


def _zero_job(Zero, cases, steps, rows, seed):
    Zero, results = resolve(Zero), []
    for sizes, name in cases:
        cls, hyper = OPTIMIZERS[name]
        model = mlp(sizes, seed)                                  # the same on every rank
        opt = Zero(model.parameters(), cls, **hyper)
        for step in range(steps):
            x, y = batch(step, rows, sizes, seed)                 # every rank: the whole batch, the same gradient
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
        inner = getattr(opt, "optimizer", None)
        results.append({"params": _flat([t.detach() for t in model.parameters()]),
                        "inner": type(inner).__name__ if inner is not None else None,
                        "inner ok": isinstance(inner, cls),
                        "state": state_numbers(inner) if isinstance(inner, torch.optim.Optimizer) else None})
    return results


def _zero_oracle(sizes, name, steps, rows, seed):
    cls, hyper = OPTIMIZERS[name]
    model = mlp(sizes, seed)
    opt = cls(model.parameters(), **hyper)
    for step in range(steps):
        x, y = batch(step, rows, sizes, seed)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return _flat([t.detach() for t in model.parameters()]), state_numbers(opt)


@exercise
def zero_optimizer(your_ZeroOptimizer):
    """Your ZeRO-1 wrapper on 3 processes around AdamW, SGD with Nesterov momentum and one more optimizer, against
    the same optimizer in one process; each rank must keep 1/p of the optimizer's state (a model of 2 numbers
    leaves one rank an empty shard)."""
    seed, steps = int(rng().integers(1 << 20)), 3
    third = str(rng().choice(["Adam", "RMSprop", "Adagrad"]))
    cases = [([1, 1], "AdamW")]   # N = 2: fewer numbers than ranks
    while len(cases) < 4:
        sizes = [int(s) for s in rng().integers(2, 8, 3)]
        n = sum(a * b + b for a, b in zip(sizes, sizes[1:]))
        if n % 2 and n % 3:
            cases.append((sizes, ["AdamW", "SGD", third][len(cases) - 1]))
    rows = int(rng().integers(2, 7))
    ps = world_sizes((3,))
    for p in ps:
        per_rank = _run(p, "_zero_job", [your_ZeroOptimizer], cases=cases, steps=steps, rows=rows, seed=seed)
        for (sizes, name), *results in zip(cases, *per_rank):
            expected, full_state = _zero_oracle(sizes, name, steps, rows, seed)
            n, per = expected.numel(), full_state // expected.numel()   # numbers of state per parameter number
            where = f"{p} ranks, {name}, layer sizes {sizes} (N = {n} numbers)"
            for rank, result in enumerate(results):
                require(result["inner ok"], f"{where}: rank {rank}'s `opt.optimizer` is "
                        f"{result['inner'] or 'missing'}, not a {name}",
                        hint="keep the optimizer you build over this rank's shard as self.optimizer, made with the "
                             "optimizer_class and the keyword arguments you were given")
            for rank, result in enumerate(results[1:], 1):
                require(torch.equal(result["params"], results[0]["params"]),
                        f"{where}: after {steps} steps rank {rank}'s parameters differ from rank 0's",
                        hint="each rank updates its own shard; then every rank must receive every updated shard "
                             "(an all-gather) and write them all into its parameters")
            shard = math.ceil(n / p)
            for rank, result in enumerate(results):
                yours = result["params"]
                bad = (yours - expected).abs() > 1e-9 * (1 + expected.abs())
                if bad.any():
                    i = int(bad.nonzero()[0])
                    raise CheckFailed(
                        f"{where}, rank {rank}: the parameters after {steps} steps differ from torch.optim.{name}'s in "
                        f"one process\n  first bad number {i} of the flat vector: yours {fmt(float(yours[i]))}, "
                        f"expected {fmt(float(expected[i]))}\n  {int(bad.sum())} of {n} numbers differ\n  hint: with "
                        f"shards of ceil(N/p) = {shard}, number {i} is rank {i // shard}'s to update; hand the "
                        "optimizer this rank's slice of the flat parameters as one leaf tensor, set its .grad to the "
                        "same slice of the flat gradients, step, and gather every rank's slice")
                most, state = per * shard, result["state"]
                require(state <= most, f"{where}: rank {rank} keeps {state} numbers of {name} state; the whole model's "
                        f"{name} keeps {full_state} ({per} per parameter number). ZeRO-1 keeps on each rank the state "
                        f"of its own shard only, 1/p of it: at most {per} x ceil(N/p) = {most} here",
                        hint="build the inner optimizer over one tensor holding this rank's slice of the flat "
                             "parameters, never over the model's parameters")
            total = sum(r["state"] for r in results)
            require(total == full_state, f"{where}: the ranks keep {total} numbers of {name} state together, the whole "
                    f"model's {name} keeps {full_state}: every number of the flat vector must be in exactly one shard",
                    hint="the shards tile [0, N): rank r's starts at min(r * ceil(N/p), N)")
    return f"AdamW, SGD and one more on {'/'.join(map(str, ps))} ranks, state 1/p per rank, an empty shard"


# ---- 4. Megatron's f and g -------------------------------------------------------------------------

def _name(obj):
    return obj.name if isinstance(obj, Code) else obj.__name__


def _is_function(obj):
    return isinstance(obj, type) and issubclass(obj, torch.autograd.Function)


def _fg_job(f, g, shapes, seed):
    f, g, rank, out = resolve(f), resolve(g), dist.get_rank(), []
    kinds = {"f": _is_function(f), "g": _is_function(g)}
    if not all(kinds.values()):
        return {"kinds": kinds}
    for shape in shapes:
        case = {}
        for name, fn in (("f", f), ("g", g)):
            x = ring_tensor(shape, rank, seed + (name == "g")).requires_grad_(True)
            upstream = ring_tensor(shape, rank, seed + 7 + (name == "g"))
            x_before, up_before = x.detach().clone(), upstream.clone()
            y = fn.apply(x)
            node = getattr(y, "grad_fn", None)
            case[name] = {"out": y.detach().clone(), "input changed": not torch.equal(x.detach(), x_before),
                          "node": getattr(getattr(node, "_forward_cls", None), "__name__", type(node).__name__)}
            if node is not None:
                y.backward(upstream)
            case[name]["grad"] = x.grad
            case[name]["gradient changed"] = not torch.equal(upstream, up_before)
        out.append(case)
    return {"kinds": kinds, "cases": out}


@exercise
def f_and_g(your_CopyToParallel, your_ReduceFromParallel):
    """Your f and g on 3 processes, forward and backward run through each: f the identity forward and the sum
    over ranks backward, g the sum forward and the identity backward, both autograd Functions."""
    seed = int(rng().integers(1 << 20))
    shapes = [(1,), (2, 5), (int(rng().integers(2, 6)), 3, int(rng().integers(1, 5)))]
    ps = world_sizes((3,))
    names = {"f": _name(your_CopyToParallel), "g": _name(your_ReduceFromParallel)}
    for p in ps:
        per_rank = _run(p, "_fg_job", [your_CopyToParallel, your_ReduceFromParallel], shapes=shapes, seed=seed)
        for name, ok in per_rank[0]["kinds"].items():
            require(ok, f"{names[name]} is not a torch.autograd.Function: a bare dist.all_reduce is invisible to "
                    "autograd, which then cannot know what its gradient is (and may have saved the tensor it changes)",
                    hint=f"write class {names[name]}(torch.autograd.Function) with a forward and a backward "
                         "@staticmethod, and call it as .apply(x)")
        for i, shape in enumerate(shapes):
            for name in ("f", "g"):
                seed_x, seed_up = seed + (name == "g"), seed + 7 + (name == "g")
                xs = [ring_tensor(shape, r, seed_x) for r in range(p)]
                ups = [ring_tensor(shape, r, seed_up) for r in range(p)]
                for rank in range(p):
                    case = per_rank[rank]["cases"][i][name]
                    what = f"{p} ranks, shape {shape}: {names[name]} ({name}) on rank {rank}"
                    require(case["node"] == names[name], f"{what}: the output's grad_fn is {case['node']}, not "
                            f"{names[name]}'s backward", hint="return the result of the forward itself (autograd "
                            "attaches your backward to it); no .detach(), no torch.no_grad()")
                    require(not case["input changed"], f"{what}: the forward changed its input in place",
                            hint="all-reduce a copy (x.clone()): autograd may have saved the input for another backward")
                    require(not case["gradient changed"], f"{what}: the backward changed the gradient it was given in "
                            "place", hint="all-reduce a copy of it: the same gradient tensor may feed other branches")
                    out_expected = xs[rank] if name == "f" else sum(xs)
                    grad_expected = sum(ups) if name == "f" else ups[rank]
                    assert_close(case["out"], out_expected, what=f"{what}: forward", rtol=1e-10, atol=1e-12,
                                 mistakes={"f's forward is the identity: x reaches this rank's slice unchanged":
                                           sum(xs), "g's forward sums the ranks' partial results (an all-reduce)":
                                           xs[rank]})
                    require(case["grad"] is not None, f"{what}: the input got no gradient", hint="backward returns "
                            "the gradient of the input: one tensor per input of forward")
                    assert_close(case["grad"], grad_expected, what=f"{what}: the input's gradient (backward)",
                                 rtol=1e-10, atol=1e-12,
                                 mistakes={"g's backward is the identity: each rank's partial sum enters the output "
                                           "with weight 1, so its gradient is the output's, unchanged": sum(ups),
                                           "f's backward sums the gradients over the ranks: x fed every rank's slice, "
                                           "so its gradient is the sum of theirs (an all-reduce)": ups[rank]})
    return f"3 shapes on {'/'.join(map(str, ps))} ranks, forward and backward"


# ---- 5. the tensor-parallel MLP --------------------------------------------------------------------

def tp_case(n_embd, rows, seq, seed):
    torch.manual_seed(seed)
    layer = MLP(GPTConfig(n_embd=n_embd)).double()
    x = torch.randn(rows, seq, n_embd, dtype=torch.float64)
    weight = torch.randn(rows, seq, n_embd, dtype=torch.float64)
    return layer, x, weight


def _graph_functions(tensor):
    """The names of the custom autograd Functions in tensor's backward graph."""
    seen, names, todo = set(), set(), [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        cls = getattr(node, "_forward_cls", None)
        if cls is not None:
            names.add(cls.__name__)
        todo.extend(n for n, _ in node.next_functions)
    return names


def _x_grad_of_one_slice(layer, x, weight, lo, hi):
    """x's gradient through hidden features [lo, hi) alone: what one rank gets without f."""
    x = x.detach().requires_grad_(True)
    hidden = F.gelu(F.linear(x, layer.c_fc.weight[lo:hi], layer.c_fc.bias[lo:hi]), approximate="tanh")
    (F.linear(hidden, layer.c_proj.weight[:, lo:hi]) * weight).sum().backward()
    return x.grad


def _mlp_job(ParallelMLP, cases):
    ParallelMLP, results = resolve(ParallelMLP), []
    for n_embd, rows, seq, seed in cases:
        layer, x, weight = tp_case(n_embd, rows, seq, seed)
        tp = ParallelMLP(layer)
        x.requires_grad_(True)
        out = tp(x)
        (out * weight).sum().backward()
        parts = {}
        for name in ("c_fc", "c_proj"):
            module = getattr(tp, name, None)
            for kind in ("weight", "bias"):
                t = getattr(module, kind, None)
                parts[f"{name}.{kind}"] = None if t is None else (t.detach().clone(), t.grad)
        results.append({"out": out.detach(), "x.grad": x.grad, "parts": parts, "functions": _graph_functions(out),
                        "numel": sum(t.numel() for t in tp.parameters())})
    return results


@exercise
def parallel_mlp(your_ParallelMLP):
    """Your tensor-parallel MLP on 3 processes against chapter 04's MLP in one process: each rank's weight slices
    and their gradients, the output and the input's gradient, with f and g in the autograd graph."""
    cases = [(4, 1, 1, 0)] + [(int(c), int(r), int(s), int(rng().integers(1 << 20)))   # 4C never a multiple of 3
                              for c, r, s in zip(rng().choice([5, 7, 8, 10, 11], 3), rng().integers(1, 4, 3),
                                                 rng().integers(1, 6, 3))]
    ps = world_sizes((3,))
    for p in ps:
        per_rank = _run(p, "_mlp_job", [your_ParallelMLP], cases=cases)
        for (n_embd, rows, seq, seed), *results in zip(cases, *per_rank):
            layer, x, weight = tp_case(n_embd, rows, seq, seed)
            x.requires_grad_(True)
            out = layer(x)
            (out * weight).sum().backward()
            hidden = F.gelu(layer.c_fc(x), approximate="tanh").detach()
            where = f"{p} ranks, n_embd={n_embd}, x of shape {tuple(x.shape)}"
            offsets = np.cumsum([0] + [len(c) for c in torch.arange(4 * n_embd).tensor_split(p)])
            for rank, result in enumerate(results):
                lo, hi = int(offsets[rank]), int(offsets[rank + 1])
                parts = result["parts"]
                missing = [k for k, v in parts.items() if v is None]
                require(not missing, f"{where}: rank {rank}'s module has no {', '.join(missing)}",
                        hint="keep this rank's slices as self.c_fc and self.c_proj, modules with .weight and .bias "
                             "(an nn.Linear each), as chapter 04's MLP names them")
                (fc_w, fc_wg), (fc_b, fc_bg), (pr_w, pr_wg), (pr_b, pr_bg) = (parts[k] for k in (
                    "c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"))
                require(fc_w.shape[0] != 4 * n_embd or p == 1, f"{where}: rank {rank} holds all {4 * n_embd} rows of "
                        "c_fc's weight: every rank holds the whole MLP", hint="each rank keeps only its slice of the "
                        "hidden features (1/p of both matrices): that is what lets a layer too big for one device fit")
                require(tuple(fc_w.shape) == (hi - lo, n_embd) and tuple(pr_w.shape) == (n_embd, hi - lo),
                        f"{where}: rank {rank}'s c_fc.weight has shape {tuple(fc_w.shape)} and c_proj.weight "
                        f"{tuple(pr_w.shape)}; its slice of the {4 * n_embd} hidden features is [{lo}, {hi})",
                        hint="rank r holds the hidden features torch.arange(4 * C).tensor_split(p)[r]: those rows of "
                             "c_fc's weight and bias, those columns of c_proj's weight, and c_proj's whole bias")
                require(torch.equal(fc_w, layer.c_fc.weight.detach()[lo:hi])
                        and torch.equal(pr_w, layer.c_proj.weight.detach()[:, lo:hi]),
                        f"{where}: rank {rank}'s weights are not rows [{lo}, {hi}) of c_fc's and the same columns of "
                        "c_proj's", hint="slice the MLP's own weights (copies of them), in rank order")
                functions = result["functions"]
                require("ReduceFromParallel" in functions, f"{where}: the output's autograd graph holds no "
                        f"ReduceFromParallel (it holds {sorted(functions) or 'no Function of yours'})",
                        hint="the ranks' partial sums meet in g, ReduceFromParallel.apply: a bare dist.all_reduce "
                             "gives the right numbers here but autograd does not know it is there")
                require("CopyToParallel" in functions, f"{where}: the output's autograd graph holds no CopyToParallel",
                        hint="x enters c_fc through f, CopyToParallel.apply(x), whose backward sums x's gradient over "
                             "the ranks")
                assert_close(result["out"], out.detach(), what=f"{where}: rank {rank}'s output", rtol=1e-9, atol=1e-11,
                             mistakes={"add c_proj's bias once, after the sum: added before g it counts p times":
                                       out.detach() + (p - 1) * layer.c_proj.bias.detach(),
                                       "GPT-2's gelu is the tanh approximation: F.gelu(h, approximate=\"tanh\")":
                                       F.linear(F.gelu(layer.c_fc(x)), layer.c_proj.weight, layer.c_proj.bias).detach(),
                                       "each rank holds only a partial sum of the output: g adds them over the ranks":
                                       hidden[..., lo:hi] @ layer.c_proj.weight[:, lo:hi].T.detach()
                                       + layer.c_proj.bias.detach()})
                for label, yours, exp in (("c_fc weight", fc_wg, layer.c_fc.weight.grad[lo:hi]),
                                          ("c_fc bias", fc_bg, layer.c_fc.bias.grad[lo:hi]),
                                          ("c_proj weight", pr_wg, layer.c_proj.weight.grad[:, lo:hi]),
                                          ("c_proj bias", pr_bg, layer.c_proj.bias.grad)):
                    require(yours is not None, f"{where}: rank {rank}'s {label} got no gradient",
                            hint="no .detach() and no torch.no_grad() on the way from x to the output")
                    assert_close(yours, exp, what=f"{where}: rank {rank}'s {label} gradient", rtol=1e-9, atol=1e-11)
                assert_close(result["x.grad"], x.grad, what=f"{where}: rank {rank}'s gradient of x", rtol=1e-9,
                             atol=1e-11, mistakes={"x's gradient is the sum of every rank's contribution: x enters "
                                                   "through f (CopyToParallel), whose backward all-reduces":
                                                   _x_grad_of_one_slice(layer, x, weight, lo, hi)})
    return f"4 MLPs on {'/'.join(map(str, ps))} ranks: slices, output, input and weight gradients"
