"""Whose code computed a training step: the calls that compute numbers, counted and timed by owner.

A training step on the course's library is Python that decides what to compute (the Functions'
bookkeeping, autograd's walk, views, the optimizer's loop) around calls that compute: a backend kernel,
or numpy inside a piece such as an embedding's scatter-add or your `adam_step`. The meter wraps those
calls. `leaf(whose, name, fn, *args)` runs fn and books its time to (whose, name). A call that itself
makes metered calls (a Function whose forward runs kernels) is not a computation of its own: only the
time between its inner calls is booked to it, as Python around them, and it does not count as a call.

Three things book calls while a meter measures (`metering(meter, backend)`):
- the backend, each kernel call (its `meter` attribute: numba_backend.py);
- `OpsBooked`, an op mode (autodiff.op_mode): every Function's forward and backward, by whose Function it
  is; it also counts the nodes the forward records;
- `adapters.Metered`, the numpy pieces (matmul_backward, adam_step, ...) an assembly hands out.

`measure_step` runs the recipe's own training step (gpt/trainer.train_step) under a meter, `describe`
says what it found, `time_steps` times a step of the learner's library against PyTorch and the course's.
"""

import collections
import contextlib
import contextvars
import functools
import time

import numpy as np

from course_lib.tensor import autodiff, use_backend

_current = contextvars.ContextVar("meter", default=None)


def current_meter():
    """The meter measuring right now, or None."""
    return _current.get()


class Meter:
    def __init__(self):
        self.calls = collections.Counter()    # (whose, name) -> computing calls
        self.seconds = collections.Counter()  # (whose, name) -> their seconds
        self.python = collections.Counter()   # (whose, name) -> seconds of a wrapper's own Python
        self.nodes = collections.Counter()    # (whose, Function) -> nodes the forwards recorded
        self._open = []                       # [seconds, calls] of inner metered calls, per open call

    def leaf(self, whose, name, fn, *args, **kwargs):
        """fn(*args, **kwargs), booked to (whose, name)."""
        self._open.append([0.0, 0])
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - start
            inner_seconds, inner_calls = self._open.pop()
            if inner_calls:
                self.python[(whose, name)] += elapsed - inner_seconds
            else:
                self.calls[(whose, name)] += 1
                self.seconds[(whose, name)] += elapsed
            if self._open:
                self._open[-1][0] += elapsed
                self._open[-1][1] += 1

    def total(self, whose=None):
        """(calls, seconds) of the computing calls of `whose` (None: everyone's)."""
        keys = [k for k in self.calls if whose is None or k[0] == whose]
        return sum(self.calls[k] for k in keys), sum(self.seconds[k] for k in keys)


def whose(function):
    """"yours" for a learner's Function (a class of a saved module, or an adapter running one), else "course"."""
    if getattr(function, "whose", None) == "yours" or getattr(function, "__module__", "").startswith("course_yours_"):
        return "yours"
    return "course"


class OpsBooked:
    """An op mode that books on `meter` the forward and backward of the learner's Functions and of those in
    `booked` (an assembly's registered pieces, whoever wrote them): the Functions that compute. The
    library's views and plumbing compute nothing of their own (their kernels book themselves). It counts
    the nodes every forward records, by whose Function made them."""

    def __init__(self, meter, booked=()):
        self.meter, self.booked = meter, set(booked)

    def apply(self, cls, inputs, kwargs, run):
        owner, name = whose(cls), getattr(cls, "label", cls.__name__)
        if autodiff.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in inputs):
            self.meter.nodes[(owner, name)] += 1
        if owner == "course" and cls not in self.booked:
            return run()
        return self.meter.leaf(owner, f"{name}.forward", run)

    def backward(self, cls, ctx, grad, run):
        owner = whose(cls)
        if owner == "course" and cls not in self.booked:
            return run()
        return self.meter.leaf(owner, f"{getattr(cls, 'label', cls.__name__)}.backward", run)

    def read(self, tensor):
        pass


@contextlib.contextmanager
def metering(meter, backend=None, booked=()):
    """Inside the block, every computing call is booked on `meter`: the learner's Functions and those in
    `booked`, the numpy pieces' (adapters.Metered), and `backend`'s kernels (a backend with a `meter`
    attribute)."""
    token = _current.set(meter)
    if backend is not None:
        backend.meter = meter
    try:
        with autodiff.op_mode(OpsBooked(meter, booked)):
            yield meter
    finally:
        if backend is not None:
            backend.meter = None
        _current.reset(token)


def measure_step(lib, model, optimizer, x, y, grad_clip=1.0):
    """One step of the recipe (gpt/trainer.train_step) on the assembly `lib`, metered. Returns
    {"meter", "seconds", "loss"}."""
    from course_lib.gpt.trainer import train_step

    with lib.running(), metering(Meter(), lib.backend, lib.functions.values()) as meter:
        start = time.perf_counter()
        loss = train_step(model, optimizer, x, y, grad_clip, lib.library)
        seconds = time.perf_counter() - start
    return {"meter": meter, "seconds": seconds, "loss": float(loss)}


def describe(measured):
    """Lines that say how much of the measured step was whose code: calls, time, the graph's nodes."""
    meter, seconds = measured["meter"], measured["seconds"]
    calls, _ = meter.total()
    mine, my_seconds = meter.total("yours")
    _, their_seconds = meter.total("course")

    def listing(owner):
        names = collections.Counter({name: n for (w, name), n in meter.calls.items() if w == owner})
        return ", ".join(f"{name} {n:,}" for name, n in names.most_common()) or "none"

    nodes = sum(meter.nodes.values())
    my_nodes = collections.Counter({name: n for (w, name), n in meter.nodes.items() if w == "yours"})
    return [f"one training step: {calls:,} calls computed its numbers; {mine:,} of them ran your code "
            f"({100 * mine / max(calls, 1):.1f}%)",
            f"  yours: {listing('yours')}",
            f"  the course's: {listing('course')}",
            f"time: {1000 * seconds:.0f} ms in all; {100 * my_seconds / seconds:.0f}% inside your code's "
            f"computations, {100 * their_seconds / seconds:.0f}% inside the course's, "
            f"{100 * (seconds - my_seconds - their_seconds) / seconds:.0f}% in the Python around them",
            f"the forward's graph: {nodes:,} nodes, {sum(my_nodes.values()):,} of them your Functions "
            f"({', '.join(sorted(my_nodes)) or 'none'}); the rest are the library's views and adds"]


def time_steps(lib, config, tokens, dtype=np.float64, steps=5, warmup=1, seed=1337, batch_size=12):
    """Median ms per training step of chapter 04's PyTorch GPT, the course's GPT on the numpy and on the
    course's Numba backend, and yours on the assembly `lib`: the same weights, the same batches, the
    recipe's own step for each, steps interleaved (a busy moment of the machine then hits all four alike)."""
    import torch

    from course_lib.capstone import COURSE
    from course_lib.capstone import GPT as CourseGPT
    from course_lib.capstone import configure_optimizer as course_optimizer
    from course_lib.gpt import trainer
    from course_lib.gpt.data import Batches
    from course_lib.gpt.model import GPT as TorchGPT

    cfg = trainer.TrainConfig()
    torch.manual_seed(seed)
    reference = TorchGPT(config).to(torch.float64 if dtype == np.float64 else torch.float32)
    runs = {"PyTorch": (reference, trainer.configure_optimizer(reference, cfg), trainer.TORCH, contextlib.nullcontext,
                        torch.from_numpy)}
    for name, backend in (("course, numpy backend", "numpy"), ("course, Numba backend", "numba")):
        model = CourseGPT.from_torch(reference)
        runs[name] = (model, course_optimizer(model, cfg), COURSE, functools.partial(use_backend, backend), np.asarray)
    model = lib.GPT.from_torch(reference)
    runs["yours"] = (model, lib.configure_optimizer(model, cfg), lib.library, lib.running, np.asarray)
    batches = Batches(tokens, config.block_size, batch_size, seed=seed)
    ms = {name: [] for name in runs}
    for i in range(warmup + steps):
        x, y = batches.get("train")
        for name, (model, optimizer, library, within, as_input) in runs.items():
            with within():
                start = time.perf_counter()
                trainer.train_step(model, optimizer, as_input(x), as_input(y), cfg.grad_clip, library)
                if i >= warmup:
                    ms[name].append(1000 * (time.perf_counter() - start))
    return {name: float(np.median(t)) for name, t in ms.items()}
