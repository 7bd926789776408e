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
from course_lib.distributed.timing import optimizers_stepped, state_numbers
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
                         "matching receive on the other rank, every rank must call each collective, in the same "
                         "order, and two ranks that both wait to receive before sending never meet (lesson 11, "
                         "*The ring*: how its exchanges are posted)")
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
                        "returned the sum in a new tensor", hint="like dist.all_reduce, the sum belongs in the tensor "
                        "you were given: a view of it writes through to it, a new tensor does not")
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
                    hint="each rank sends to one neighbour and receives from the other; gathering on rank 0 makes "
                         "its link carry (p - 1) times the tensor (lesson 11, *The ring*)")
            elements = sum(k for _, k in case["sent"])
            bound = 2 * (p - 1) * math.ceil(n / p)
            require(elements <= bound, f"{p} ranks: rank {rank} sent {elements} numbers for a tensor of {n}: a ring "
                    f"sends 2(p - 1) chunks of about n/p numbers, at most {bound} here",
                    hint="one chunk of about n/p numbers per step, never the whole tensor: passing whole tensors "
                         "around the ring sends (p - 1)·n numbers, the chunked ring 2(p - 1)/p·n (lesson 11, *The ring*)")
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

class Branchy(nn.Module):
    """The DDP check's first model: the output layer registered first, a layer used twice and a branch that
    skips the middle, so that its gradients do not land in the reverse of `parameters()`'s order."""

    def __init__(self, sizes):
        super().__init__()
        a, h, b = sizes
        self.head = nn.Linear(h, b)   # used last, registered first
        self.stem = nn.Linear(a, h)
        self.body = nn.Linear(h, h)   # used twice: its gradient lands once, after both uses
        self.skip = nn.Linear(a, b, bias=False)   # from the input straight to the output (a bias here would get
                                                  # the same gradient as head's)

    def forward(self, x):
        z = torch.tanh(self.stem(x))
        z = torch.tanh(self.body(z))
        z = torch.tanh(self.body(z))
        return self.head(z) + self.skip(x)


class Chain(nn.Module):
    """The second model: four square layers without biases (the last one registered first). Every parameter
    has the same bytes, so with bucket_bytes = two of them, a bucket closes on two whatever its order."""

    def __init__(self, sizes):
        super().__init__()
        (h,) = sizes
        self.last = nn.Linear(h, h, bias=False)
        self.layers = nn.ModuleList(nn.Linear(h, h, bias=False) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.last(x)


class Crossed(nn.Module):
    """The third model: two twin layers from the input, run in one order on even ranks and in the other on odd
    ones (as a branch on the data would), so their gradients land in a different order on each rank. Buckets
    sent as they complete would pair one rank's `left` with the other's `right`."""

    def __init__(self, sizes):
        super().__init__()
        a, h, b = sizes
        self.left, self.right = nn.Linear(a, h), nn.Linear(a, h)
        self.out = nn.Linear(h, b)
        self.flip = dist.is_initialized() and dist.get_rank() % 2 == 1

    def forward(self, x):
        if self.flip:                              # the same sum, its terms computed in the other order
            right = torch.sin(self.right(x))
            left = torch.tanh(self.left(x))
        else:
            left = torch.tanh(self.left(x))
            right = torch.sin(self.right(x))
        return self.out(left + right)


MODELS = {"branchy": Branchy, "chain": Chain, "crossed": Crossed}


def model_of(kind, sizes, seed):
    torch.manual_seed(seed)
    return MODELS[kind](sizes).double()


def mlp(sizes, seed):
    """The ZeRO check's model: linear layers of the given sizes with tanh between them."""
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


def _bucket_of(flat, params, world_size):
    """The parameters whose gradients `flat` holds end to end, in its order; None if it holds anything else.

    A gradient may come already divided by the world size; a parameter without one matches zeros."""
    flat = flat.detach().reshape(-1)

    def matches(i, offset, divided):
        n = params[i].numel()
        if offset + n > flat.numel():
            return False
        piece, grad = flat[offset:offset + n], params[i].grad
        grad = grad.detach().reshape(-1) if grad is not None else torch.zeros_like(piece)
        return torch.allclose(piece, grad / world_size, rtol=1e-13, atol=0) if divided else torch.equal(piece, grad)

    def search(offset, found):   # depth first: zeros can match several parameters, only one way may cover flat
        if offset == flat.numel():
            return tuple(found)
        for divided in (False, True):
            for i in range(len(params)):
                if i not in found and matches(i, offset, divided):
                    whole = search(offset + params[i].numel(), found + [i])
                    if whole is not None:
                        return whole
        return None

    return search(0, [])


def _ddp_job(DDP, cases, steps, rows, seed):
    rank, p, results = dist.get_rank(), dist.get_world_size(), []
    log, params = [], []
    all_reduce = dist.all_reduce

    def watched_all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        log.append(("all_reduce", _bucket_of(tensor, params, p), tensor.numel(), bool(async_op)))
        return all_reduce(tensor, op=op, group=group, async_op=async_op)

    with _patched(dist, all_reduce=watched_all_reduce), _patched(c10d, all_reduce=watched_all_reduce):
        DDP = resolve(DDP)
        for kind, sizes, bucket_bytes in cases:
            log.clear()
            model = model_of(kind, sizes, seed + rank)   # different on each rank: the broadcast must fix that
            params[:] = model.parameters()
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


def _train_one_process(kind, sizes, seed, steps, rows, lr):
    model = model_of(kind, sizes, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        x, y = batch(step, rows, sizes, seed)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return [t.detach() for t in model.parameters()]


def _check_buckets(where, log, numels, bucket_bytes, itemsize=8):
    """Walk one rank's log. A backward inside no_sync sends nothing. A backward outside it sends every gradient
    once, in buckets that close once they hold bucket_bytes, each as soon as it and the buckets sent before it
    are complete, the first one before the backward's last gradient has landed. Returns {step: its buckets}."""
    per_step, k = {}, 0
    while k < len(log):
        if log[k][0] != "backward":
            k += 1
            continue
        _, step, syncing = log[k]
        end = log.index(("backward returned",), k)
        segment = log[k + 1:end]
        k = end + 1
        sends = [e for e in segment if e[0] == "all_reduce"]
        what = f"{where}, step {step}"
        if not syncing:
            require(not sends, f"{what}: the backward inside `with ddp.no_sync():` started {len(sends)} all-reduce(s)",
                    hint="inside no_sync the gradients only add up in .grad; the backward after it sends their sums "
                         "(lesson 11, *Gradient accumulation*)")
            continue
        finish = log.index(("finish returned",), end)
        later = [e for e in log[end:finish] if e[0] == "all_reduce"]
        require(sends, f"{what}: no bucket was sent during backward; {len(later)} all-reduce(s) started after it had "
                "returned" + ("" if step == 0 else ", though an earlier step's buckets left during backward"),
                hint="a bucket can leave from the gradient hook, while autograd still works on the first layers; "
                     "finish() is where the waiting happens (lesson 11, *Send now, wait later*)"
                     + ("" if step == 0 else ". If an earlier step sent during backward, look at what you count per "
                        "bucket: it must start afresh for each backward that sends (*Gradient accumulation*)"))
        for e in sends + later:
            require(e[1] is not None, f"{what}: an all-reduce of {e[2]} numbers carried something else than this "
                    "rank's gradients laid end to end, as .grad held them when it started",
                    hint="each bucket travels as one flat tensor of its parameters' gradients; a bucket that leaves "
                         "before one of its gradients has landed carries a zero or a stale value in its place")
        for e in sends:
            require(e[3], f"{what}: the all-reduce of parameters {list(e[1])} blocked the backward until it had "
                    "finished (async_op=False)", hint="an asynchronous collective returns at once with a work to "
                    "wait on later (lesson 11, *Send now, wait later*)")
        landed = set()
        for e in segment:
            if e[0] == "landed":
                landed.add(e[1])
            elif e[0] == "all_reduce":
                missing = sorted(set(e[1]) - landed)
                require(not missing, f"{what}: the bucket of parameters {list(e[1])} left before the gradient of "
                        f"parameter(s) {missing} had landed", hint="a bucket may go once every one of its gradients "
                        "has landed in this backward; what you count per bucket must start afresh for each backward "
                        "that sends, and the backward passes inside no_sync do not count")
        buckets = [e[1] for e in sends + later]   # in the order they left
        require(sorted(i for b in buckets for i in b) == list(range(len(numels))),
                f"{what}: your all-reduces carried the gradients of parameters {[list(b) for b in buckets]}; every "
                f"one of the {len(numels)} parameters belongs to exactly one bucket",
                hint="each gradient travels once per step, in its bucket")
        for b in buckets:
            sizes = [numels[i] * itemsize for i in b]
            require(len(b) == 1 or sum(sizes) - max(sizes) < bucket_bytes,
                    f"{what}: a bucket of parameters {list(b)} held {sum(sizes)} bytes, and {sum(sizes) - max(sizes)} "
                    f"without its largest tensor: it had reached bucket_bytes={bucket_bytes} before its last tensor",
                    hint="a bucket closes as soon as it holds at least bucket_bytes; one that reaches it exactly is "
                         "full too")
        small = [list(b) for b in buckets if sum(numels[i] for i in b) * itemsize < bucket_bytes]
        require(len(small) <= 1, f"{what}: the buckets of parameters {small} each hold fewer than "
                f"bucket_bytes={bucket_bytes} bytes; only the one left over at the end may",
                hint="a bucket stays open until it holds bucket_bytes (lesson 11, *Buckets*)")
        landed, sent = set(), 0
        for e in segment + [("end",)]:
            if e[0] == "all_reduce":
                sent += 1
                continue
            ready = 0
            while ready < len(buckets) and set(buckets[ready]) <= landed:
                ready += 1
            after = "when backward returned" if e[0] == "end" else f"after {len(landed)} of {len(numels)} gradients"
            require(sent >= ready, f"{what}: {after}, your first {ready} bucket(s) were complete but only {sent} "
                    "had been sent", hint="a bucket goes as soon as it and the ones ahead of it are complete, and one "
                    "landing gradient may complete several buckets at once (lesson 11, *Buckets*)")
            if e[0] == "landed":
                landed.add(e[1])
        if len(buckets) > 1:   # every bucket left during backward: did the first one leave before its end?
            last = max(j for j, e in enumerate(segment) if e[0] == "landed")
            first = next(j for j, e in enumerate(segment) if e[0] == "all_reduce")
            require(first < last, f"{what}: all {len(buckets)} buckets left after the backward's last gradient had "
                    "landed: none of the communication overlapped the backward",
                    hint="your first bucket holds gradients that land last; lesson 11's *When a gradient is ready* "
                         "shows the order they land in")
        per_step[step] = buckets
    return per_step


@exercise
def ddp(your_DDP):
    """Your DDP on 2 processes, each rank starting from its own weights, on three models whose gradients land out of
    the parameters' reverse order (the third's in another order on each rank): broadcast; every gradient
    all-reduced once, in buckets that close at bucket_bytes, sent asynchronously during backward as soon as
    complete, in one order on every rank; finish() averaging once; no_sync() for gradient accumulation; the
    training equal to one process on the global batch."""
    seed, steps = int(rng().integers(1 << 20)), 3
    a, h, b = int(rng().integers(2, 7)), int(rng().integers(3, 12)), int(rng().integers(1, 5))
    width = int(rng().integers(2, 7))
    cases = [("branchy", [a, h, b], 0), ("branchy", [a, h, b], a * b * 8), ("branchy", [a, h, b], 2**20),
             ("chain", [width], 2 * width * width * 8),   # the second: exactly the skip layer's bytes
             ("crossed", [a, h, b], 0)]                   # gradients land in another order on each rank
    ps = world_sizes((2,))
    for p in ps:
        rows = p * 2 * int(rng().integers(1, 4))   # equal slices, each cut in two micro-batches at step 1
        per_rank = _run(p, "_ddp_job", [your_DDP], cases=cases, steps=steps, rows=rows, seed=seed)
        for (kind, sizes, bucket_bytes), *results in zip(cases, *per_rank):
            first = [t.detach() for t in model_of(kind, sizes, seed).parameters()]
            expected, summed, halved = (_train_one_process(kind, sizes, seed, steps, rows, lr)
                                        for lr in (0.1, 0.1 * p, 0.1 / p))
            numels = [t.numel() for t in first]
            where = f"{p} ranks, the {kind} model {sizes}, bucket_bytes={bucket_bytes}"
            for rank, result in enumerate(results):
                for i, (yours, exp) in enumerate(zip(result["start"], first)):
                    require(torch.equal(yours, exp), f"{where}: right after DDP(model, ...), rank {rank}'s parameter "
                            f"{i} is not rank 0's (every rank built its model from its own seed)",
                            hint="all ranks start from one rank's weights (lesson 11, *Every rank the same*)")
            orders = [_check_buckets(f"{where}, rank {rank}", result["log"], numels, bucket_bytes)
                      for rank, result in enumerate(results)]
            for rank, order in enumerate(orders[1:], 1):
                for step, buckets in order.items():
                    require(buckets == orders[0].get(step), f"{where}, step {step}: rank {rank} sent the buckets "
                            f"{[list(b) for b in buckets]}, rank 0 {[list(b) for b in orders[0].get(step, [])]}",
                            hint="collectives pair up in call order: every rank sends the same buckets in the same "
                                 "order, whatever order its gradients land in (lesson 11, *Buckets*)")
            for rank, result in enumerate(results):
                for i, (yours, exp) in enumerate(zip(result["params"], expected)):
                    assert_close(yours, exp, what=f"{where}, rank {rank}: parameter {i} after {steps} SGD steps "
                                 "(one of them two micro-batches)", rtol=1e-9, atol=1e-11,
                                 mistakes={"the gradients were summed, not averaged: the mean divides the sum by the "
                                           "world size": summed[i],
                                           "the gradients were divided by the world size twice": halved[i]})
    return (f"3 models, {len(cases)} cases, {'/'.join(map(str, ps))} ranks against one process; the buckets left "
            "during backward, each as soon as complete, in one order on every rank, also where gradients land in "
            "another order on each rank")


# ---- 3. the ZeRO-1 wrapper -------------------------------------------------------------------------

OPTIMIZERS = {
    "AdamW": (torch.optim.AdamW, dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)),
    "SGD": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    "Adam": (torch.optim.Adam, dict(lr=0.03, amsgrad=True, weight_decay=0.01)),
    "RMSprop": (torch.optim.RMSprop, dict(lr=0.01, momentum=0.5, centered=True)),
    "Adagrad": (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01)),
}


def _zero_job(Zero, cases, steps, rows, seed):
    Zero, results = resolve(Zero), []
    for sizes, name in cases:
        cls, hyper = OPTIMIZERS[name]
        model = mlp(sizes, seed)                                  # the same on every rank
        with optimizers_stepped() as stepped:                     # every optimizer stepping inside your wrapper
            opt = Zero(model.parameters(), cls, **hyper)
            for step in range(steps):
                x, y = batch(step, rows, sizes, seed)             # every rank: the whole batch, the same gradient
                opt.zero_grad()
                F.mse_loss(model(x), y).backward()
                opt.step()
        results.append({"params": _flat([t.detach() for t in model.parameters()]),
                        "stepped": sorted({type(o).__name__ for o in stepped}),
                        "wraps": any(isinstance(o, cls) for o in stepped), "state": state_numbers(stepped)})
    return results


def _zero_oracle(sizes, name, steps, rows, seed):
    cls, hyper = OPTIMIZERS[name]
    model = mlp(sizes, seed)
    start = _flat([t.detach().clone() for t in model.parameters()])
    opt = cls(model.parameters(), **hyper)
    for step in range(steps):
        x, y = batch(step, rows, sizes, seed)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return start, _flat([t.detach() for t in model.parameters()]), state_numbers([opt]), \
        [t.numel() for t in model.parameters()]


@exercise
def zero_optimizer(your_ZeroOptimizer):
    """Your ZeRO-1 wrapper on 3 processes around AdamW, SGD with Nesterov momentum and one more optimizer, against
    the same optimizer in one process. However the numbers are split, each rank keeps the state of its share:
    about 1/p of the whole (a model of 2 numbers leaves one rank with nothing)."""
    seed, steps = int(rng().integers(1 << 20)), 3
    third = str(rng().choice(["Adam", "RMSprop", "Adagrad"]))
    cases = [([1, 1], "AdamW")]   # N = 2: fewer numbers than ranks
    while len(cases) < 4:
        sizes = [int(s) for s in rng().integers(2, 8, 4)]   # three layers, six tensors
        n = sum(a * b + b for a, b in zip(sizes, sizes[1:]))
        # N not a multiple of 2 or 3, and N mod 3 once 1, once 2: shares of unequal sizes in either order, so
        # that padding a share for all_gather and keeping the padding shows in the middle of the parameters
        if n % 2 and n % 3 and (len(cases) == 3 or n % 3 == len(cases)):
            cases.append((sizes, ["AdamW", "SGD", third][len(cases) - 1]))
    rows = int(rng().integers(2, 7))
    ps = world_sizes((3,))
    for p in ps:
        per_rank = _run(p, "_zero_job", [your_ZeroOptimizer], cases=cases, steps=steps, rows=rows, seed=seed)
        for (sizes, name), *results in zip(cases, *per_rank):
            start, expected, full_state, numels = _zero_oracle(sizes, name, steps, rows, seed)
            n, per, largest = expected.numel(), full_state // expected.numel(), max(numels)
            where = f"{p} ranks, {name}, layer sizes {sizes} (N = {n} numbers in {len(numels)} tensors)"
            require(any(r["wraps"] for r in results), f"{where}: no rank stepped a {name} (they stepped "
                    f"{sorted({c for r in results for c in r['stepped']}) or 'no torch optimizer'})",
                    hint="ZeRO-1 runs the optimizer class it is given, with the keyword arguments it is given: its "
                         "update and its state, on a share of the numbers")
            for rank, result in enumerate(results[1:], 1):
                require(torch.equal(result["params"], results[0]["params"]),
                        f"{where}: after {steps} steps rank {rank}'s parameters differ from rank 0's",
                        hint="each rank updates its share; every rank must then receive every other share "
                             "(lesson 11, *Gathering unequal pieces*)")
            for rank, result in enumerate(results):
                yours = result["params"]
                bad = (yours - expected).abs() > 1e-9 * (1 + expected.abs())
                if bad.any():
                    i = int(bad.nonzero()[0])
                    idle = bool(yours[i] == start[i])
                    raise CheckFailed(
                        f"{where}, rank {rank}: the parameters after {steps} steps differ from torch.optim.{name}'s in "
                        f"one process\n  first bad number {i} of the parameters laid end to end: yours "
                        f"{fmt(float(yours[i]))}, expected {fmt(float(expected[i]))}"
                        + (" (it never moved from its first value)" if idle else "")
                        + f"\n  {int(bad.sum())} of {n} numbers differ\n  hint: "
                        + ("no rank's update reached it: every number belongs to exactly one rank's share, and the "
                           "updated shares must reach every rank" if idle else
                           "each number is updated with its own gradient, by the optimizer it was given, built with "
                           "the keyword arguments it was given (lesson 11, *What the optimizer keeps*)"))
            share = (n + (p - 1) * largest) // p
            for rank, result in enumerate(results):
                state = result["state"]
                require(state <= per * share, f"{where}: rank {rank} keeps {state} numbers of {name} state. The whole "
                        f"model's {name} keeps {full_state}, {per} per parameter number; one rank's share of the "
                        f"{n} numbers is about N/p, at most {share} here (N/p, plus less than one tensor when whole "
                        f"tensors are dealt out: the largest holds {largest}), so at most {per * share} numbers of "
                        "state", hint="an optimizer keeps state for every number it is handed: hand it this rank's "
                        "share only (lesson 11, *What the optimizer keeps*)")
            total = sum(r["state"] for r in results)
            require(total <= per * (n + p - 1), f"{where}: the ranks keep {total} numbers of {name} state together, "
                    f"the whole model's {name} {full_state}: some numbers' state is kept on more than one rank",
                    hint="ZeRO-1 splits the state: each number's state lives on the one rank that updates it")
    return (f"AdamW, SGD and one more on {'/'.join(map(str, ps))} ranks; each rank's state at most its share, about "
            "1/p, and one rank with no share")


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
    """Your f and g on 3 processes, forward and backward run through each, against what the tensor-parallel MLP
    needs where x enters the ranks' slices (f) and where their partial sums meet (g): both autograd Functions,
    neither changing a tensor it is handed."""
    seed = int(rng().integers(1 << 20))
    shapes = [(1,), (2, 5), (int(rng().integers(2, 6)), 3, int(rng().integers(1, 5)))]
    ps = world_sizes((3,))
    names = {"f": _name(your_CopyToParallel), "g": _name(your_ReduceFromParallel)}
    for p in ps:
        per_rank = _run(p, "_fg_job", [your_CopyToParallel, your_ReduceFromParallel], shapes=shapes, seed=seed)
        for name, ok in per_rank[0]["kinds"].items():
            require(ok, f"{names[name]} is not a torch.autograd.Function: a bare dist.all_reduce is invisible to "
                    "autograd, which then cannot know what its gradient is (and may have saved the tensor it changes)",
                    hint="autograd sees a collective, and knows its gradient, only inside a torch.autograd.Function "
                         "(lesson 11, *Gradients across the ranks*)")
        for i, shape in enumerate(shapes):
            for name in ("f", "g"):
                seed_x, seed_up = seed + (name == "g"), seed + 7 + (name == "g")
                xs = [ring_tensor(shape, r, seed_x) for r in range(p)]
                ups = [ring_tensor(shape, r, seed_up) for r in range(p)]
                for rank in range(p):
                    case = per_rank[rank]["cases"][i][name]
                    what = f"{p} ranks, shape {shape}: {names[name]} ({name}) on rank {rank}"
                    require(case["node"] == names[name], f"{what}: the output's grad_fn is {case['node']}, not "
                            f"{names[name]}'s backward", hint="autograd attaches your backward to what the forward "
                            "returns: a result detached from the graph, or made under no_grad, carries none")
                    require(not case["input changed"], f"{what}: the forward changed its input in place",
                            hint="the input is not this Function's to change: autograd may have saved it for another "
                                 "backward (lesson 11, *Gradients across the ranks*: the invisible all-reduce)")
                    require(not case["gradient changed"], f"{what}: the backward changed the gradient it was given in "
                            "place", hint="the incoming gradient is not this Function's to change: the same tensor may "
                            "feed other branches of the graph")
                    out_expected = xs[rank] if name == "f" else sum(xs)
                    grad_expected = sum(ups) if name == "f" else ups[rank]
                    assert_close(case["out"], out_expected, what=f"{what}: forward", rtol=1e-10, atol=1e-12,
                                 mistakes={"this forward summed over the ranks where x enters the slices: each "
                                           "rank's slice computes from x as it is": sum(xs),
                                           "this forward left each rank's partial result alone where the partial "
                                           "sums meet: the output is their sum": xs[rank]})
                    require(case["grad"] is not None, f"{what}: the input got no gradient", hint="backward returns "
                            "the gradient of the input: one tensor per input of forward")
                    assert_close(case["grad"], grad_expected, what=f"{what}: the input's gradient (backward)",
                                 rtol=1e-10, atol=1e-12,
                                 mistakes={"this backward summed over the ranks where the partial sums meet: each "
                                           "partial sum enters the output with weight 1 (lesson 11, *Gradients across "
                                           "the ranks*)": sum(ups),
                                           "this backward kept this rank's gradient alone where x enters the slices: "
                                           "x fed every rank's slice (lesson 11, *Gradients across the ranks*)":
                                           ups[rank]})
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
                        "c_proj's", hint="each rank's slices are copies of the MLP's own weights, in rank order")
                functions = result["functions"]
                require("ReduceFromParallel" in functions, f"{where}: the output's autograd graph holds no "
                        f"ReduceFromParallel (it holds {sorted(functions) or 'no Function of yours'})",
                        hint="the ranks' partial sums meet in g: a bare dist.all_reduce gives the right numbers here, "
                             "but autograd does not know it is there")
                require("CopyToParallel" in functions, f"{where}: the output's autograd graph holds no CopyToParallel",
                        hint="x enters the ranks' slices through f, or its gradient misses the other ranks' part")
                assert_close(result["out"], out.detach(), what=f"{where}: rank {rank}'s output", rtol=1e-9, atol=1e-11,
                             mistakes={"c_proj's bias was added on every rank before the sum, so it counts p times":
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
