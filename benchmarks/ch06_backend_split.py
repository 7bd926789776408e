"""Where a training step's time goes on the numpy and Numba backends, and how fast the Numba one could get.

For the digits MLP (ch06_mlp.py) and the capstone GPT (ch12_gpt.py, one thread), it splits a step into
the backend's calls, by kind, and the rest: the library's Python (Functions, autograd, views, modules, the
optimizer's bookkeeping), which is the same code on both backends. From the split it prints three ratios
of the Numba backend's speed to the numpy backend's:

  now            the whole steps, as measured;
  no Python      the backend calls alone: the ratio if the library's Python cost nothing on both;
  and what the Numba step would need for 1.5x, against what it spends outside the products now.

    python benchmarks/ch06_backend_split.py [--model mlp|gpt|both] [--steps N] [--threads 1]

The steps alternate between the two backends, so load on the machine hits both alike. Each step runs
twice: once as it is, for the step's time, and once with every backend method wrapped in a timer, for the
split (the wrapper's own cost then stays out of the step's time). Figures are medians over the steps, so
a column's rows need not add up exactly to its total.
"""

import argparse
import collections
import contextlib
import time

import common

common.pin_threads(1)   # numpy's BLAS, Numba and torch on --threads (default 1), before they load

import ch12_gpt  # noqa: E402
import numpy as np  # noqa: E402
from ch06_mlp import BATCH, course_model, course_step  # noqa: E402

from course_lib.data import load_digits  # noqa: E402
from course_lib.tensor import DataLoader, current_backend, use_backend  # noqa: E402

BACKENDS = ("numpy", "numba")
METHODS = ("map", "zip", "reduce", "where", "matmul", "adam")
KINDS = ("products", "zips", "sigmoid", "other maps", "copies", "reductions", "where", "adam (fused)")


def kind(method, args):
    """The row a backend call goes in."""
    if method == "matmul":
        return "products"
    if method == "map":
        return {"id": "copies", "sigmoid": "sigmoid"}.get(args[0], "other maps")
    return {"zip": "zips", "reduce": "reductions", "adam": "adam (fused)"}.get(method, method)


@contextlib.contextmanager
def timed_calls(seconds):
    """Time every call of the current backend's methods into seconds[kind] (a nested call counts once)."""
    backend, depth = current_backend(), [0]

    def timer(method, call):
        def timed(*args, **kwargs):
            if depth[0]:
                return call(*args, **kwargs)
            depth[0] += 1
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                seconds[kind(method, args)] += time.perf_counter() - start
                depth[0] -= 1
        return timed

    wrapped = [m for m in METHODS if hasattr(backend, m)]
    for method in wrapped:  # an attribute of the instance hides the class's method
        setattr(backend, method, timer(method, getattr(backend, method)))
    try:
        yield
    finally:
        for method in wrapped:
            delattr(backend, method)


def split(make_runs, batches, warmup):
    """ms per step on each backend: the whole step, each kind of backend call, and their sum."""
    runs = {backend: make_runs() for backend in BACKENDS}  # (step function, its arguments): one model each
    steps = {b: [] for b in BACKENDS}
    kinds = {b: collections.defaultdict(list) for b in BACKENDS}
    for i, batch in enumerate(batches):
        for backend, (step, state) in runs.items():
            with use_backend(backend):
                start = time.perf_counter()
                step(*state, *batch)
                whole = time.perf_counter() - start
                seconds = collections.defaultdict(float)
                with timed_calls(seconds):
                    step(*state, *batch)
            if i >= warmup:
                steps[backend].append(whole)
                for k in KINDS:
                    kinds[backend][k].append(seconds[k])
                kinds[backend]["backend in all"].append(sum(seconds.values()))
    return {b: {"step": 1e3 * np.median(steps[b]), **{k: 1e3 * np.median(v) for k, v in kinds[b].items()}}
            for b in BACKENDS}


def report(title, ms):
    npy, nba = ms["numpy"], ms["numba"]
    print(f"\n{title}\n  {'ms per step':24s} {'numpy':>8s} {'numba':>8s}")
    for row in KINDS + ("backend in all",):
        print(f"  {row:24s} {npy[row]:8.3f} {nba[row]:8.3f}")
    for b in (npy, nba):
        b["rest"] = b["step"] - b["backend in all"]
    print(f"  {'the rest (Python)':24s} {npy['rest']:8.3f} {nba['rest']:8.3f}")
    print(f"  {'whole step':24s} {npy['step']:8.3f} {nba['step']:8.3f}")
    target = npy["step"] / 1.5
    outside = nba["step"] - nba["products"]
    print(f"  Numba's speed / numpy's: now {npy['step'] / nba['step']:.2f}x; "
          f"with no Python on either {npy['backend in all'] / nba['backend in all']:.2f}x")
    print(f"  For 1.5x the Numba step must take {target:.2f} ms: {target - nba['products']:.2f} ms beside its "
          f"products, against {outside:.2f} ms now ({nba['rest']:.2f} of them Python)")


def mlp_runs():
    return course_step, course_model()


def mlp_batches(steps):
    X, _, y, _ = load_digits()
    batches, epoch = [], 0
    while len(batches) < steps:
        batches += list(DataLoader(X, y, batch_size=BATCH, seed=epoch))
        epoch += 1
    return batches[:steps]


def gpt_runs(reference):
    from course_lib.capstone import GPT, configure_optimizer, train_step
    from course_lib.gpt import TrainConfig
    model = GPT.from_torch(reference)
    return train_step, (model, configure_optimizer(model, TrainConfig()))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=("mlp", "gpt", "both"), default="both")
    p.add_argument("--steps", type=int, default=0, help="timed steps (default: 300 for the MLP, 12 for the GPT)")
    p.add_argument("--threads", type=int, default=1, help="read by common.pin_threads before numpy starts")
    args = p.parse_args()
    print(f"{args.threads} thread(s) for numpy's BLAS and Numba")
    if args.model in ("mlp", "both"):
        steps = args.steps or 300
        ms = split(mlp_runs, mlp_batches(steps + 30), warmup=30)
        report(f"Digits MLP (64-256-256-10, batch {BATCH}, Adam, float32), median of {steps} steps", ms)
    if args.model in ("gpt", "both"):
        import torch

        from course_lib.gpt import make_get_batch
        from course_lib.gpt.model import GPT as TorchGPT
        steps = args.steps or 12
        ids, config = ch12_gpt.setup()
        torch.manual_seed(1337)
        reference = TorchGPT(config)
        get_batch = make_get_batch(ids, config.block_size, 12, seed=1)
        ms = split(lambda: gpt_runs(reference), [get_batch("train") for _ in range(steps + 3)], warmup=3)
        report(f"Capstone GPT (nanoGPT's CPU config, float32, AdamW), median of {steps} steps", ms)


if __name__ == "__main__":
    main()
