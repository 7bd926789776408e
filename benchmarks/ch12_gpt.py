"""The course's capstone GPT (its answers to chapter 12, course_lib.capstone, on the numpy and Numba backends)
against chapter 04's PyTorch GPT.

Configuration: nanoGPT's CPU one (4 layers, 4 heads, 128 wide, block 64, batch 12, dropout 0), float32,
char-level on the course corpus. All three models start from the same weights and take the same
batches; their steps are interleaved, so machine load hits them alike. Each takes the recipe's own step
(gpt/trainer.train_step: forward, backward, clipping, AdamW) on its library. Prints the median ms per
step and the ratios to PyTorch.

    python benchmarks/ch12_gpt.py [--steps 30] [--threads 1]
    python benchmarks/ch12_gpt.py --profile          # cProfile one step on each backend: the top costs
    python benchmarks/ch12_gpt.py --curves           # float64, full config: 20 steps' losses vs PyTorch
    python benchmarks/ch12_gpt.py --full-run 2000    # float32, a whole run each: the validation losses
"""

import argparse
import cProfile
import io
import pstats
import time

import common

# The three models take turns in this one process; all on the same number of threads (--threads, default 1).
THREADS = common.pin_threads(1)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from course_lib.capstone import COURSE, GPT  # noqa: E402
from course_lib.capstone import configure_optimizer as course_optimizer  # noqa: E402
from course_lib.capstone.train import evaluate as course_estimate  # noqa: E402
from course_lib.capstone.train import train as course_train  # noqa: E402
from course_lib.data import load_text  # noqa: E402
from course_lib.gpt import TrainConfig, estimate_loss, train, trainer  # noqa: E402
from course_lib.gpt import configure_optimizer as torch_optimizer  # noqa: E402
from course_lib.gpt.data import Batches  # noqa: E402
from course_lib.gpt.model import GPT as TorchGPT  # noqa: E402
from course_lib.gpt.model import GPTConfig  # noqa: E402
from course_lib.gpt.tokenizers import CharTokenizer  # noqa: E402
from course_lib.tensor import use_backend  # noqa: E402


def setup():
    text = load_text()
    tok = CharTokenizer(text)
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
    return tok.encode(text), config


def timed_steps(config, ids, steps, warmup=3):
    """Median ms per step of the PyTorch GPT and the course GPT on each backend, steps interleaved."""
    cfg = TrainConfig()
    torch.manual_seed(1337)
    ref = TorchGPT(config)
    runs = {"pytorch": (ref, torch_optimizer(ref, cfg), trainer.TORCH, None)}
    for backend in ("numpy", "numba"):
        model = GPT.from_torch(ref)
        runs[backend] = (model, course_optimizer(model, cfg), COURSE, backend)
    batches = Batches(ids, config.block_size, 12, seed=1)
    times = {name: [] for name in runs}
    for i in range(warmup + steps):
        x, y = batches.get("train")
        for name, (model, opt, lib, backend) in runs.items():
            inputs = (torch.from_numpy(x), torch.from_numpy(y)) if backend is None else (x, y)
            with use_backend(backend or "numpy"):
                t0 = time.perf_counter()
                trainer.train_step(model, opt, *inputs, cfg.grad_clip, lib)
                if i >= warmup:
                    times[name].append(1000 * (time.perf_counter() - t0))
    return {name: float(np.median(ts)) for name, ts in times.items()}


def profile_step(config, ids, backend, top=18):
    """cProfile of one training step (after two warm-up steps) on `backend`: the functions with the most own time."""
    cfg = TrainConfig()
    torch.manual_seed(1337)
    model = GPT(config)
    opt = course_optimizer(model, cfg)
    batches = Batches(ids, config.block_size, 12, seed=1)
    with use_backend(backend):
        for _ in range(2):
            trainer.train_step(model, opt, *batches.get("train"), cfg.grad_clip, COURSE)
        x, y = batches.get("train")
        prof = cProfile.Profile()
        prof.enable()
        trainer.train_step(model, opt, x, y, cfg.grad_clip, COURSE)
        prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    print(f"\n--- one step on the {backend} backend: {stats.total_calls:,} calls, {stats.total_tt * 1000:.0f} ms "
          "under the profiler ---")
    stats.sort_stats("tottime").print_stats(top)
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip()))


def torch_batches(batches):
    return lambda split: tuple(torch.from_numpy(a) for a in batches.get(split))


def curves(config, ids, steps=20):
    """float64: chapter 04's train on PyTorch and the course's train on each backend, the same weights and batches."""
    cfg = TrainConfig(max_iters=steps, eval_interval=0, eval_iters=1)
    for backend in ("numpy", "numba"):
        torch.manual_seed(1337)
        ref = TorchGPT(config).double()
        ours = GPT.from_torch(ref)
        theirs = train(ref, torch_batches(Batches(ids, config.block_size, 12, seed=1)), cfg, progress=False)
        with use_backend(backend):
            mine = course_train(ours, course_optimizer(ours, cfg), Batches(ids, config.block_size, 12, seed=1), cfg,
                                COURSE)
        diff = np.abs(np.array(mine["loss"]) - np.array(theirs["loss"]))
        print(f"float64, {steps} steps, {backend} backend: largest loss difference {diff.max():.2e} "
              f"(losses {theirs['loss'][0]:.4f} -> {theirs['loss'][-1]:.4f})")


def full_run(config, ids, iters, backend):
    """A whole float32 run of each from the same weights and batches; both evaluated on the same 200 batches."""
    cfg = TrainConfig(max_iters=iters, lr=1e-3, min_lr=1e-4, warmup_iters=100, lr_decay_iters=iters,
                      eval_interval=0, eval_iters=20)
    torch.manual_seed(1337)
    ref = TorchGPT(config)
    ours = GPT.from_torch(ref)
    t0 = time.perf_counter()
    h_ref = train(ref, torch_batches(Batches(ids, config.block_size, 12, seed=1337)), cfg, progress=False)
    t1 = time.perf_counter()
    with use_backend(backend):
        h_ours = course_train(ours, course_optimizer(ours, cfg), Batches(ids, config.block_size, 12, seed=1337), cfg,
                              COURSE)
        val_ours = course_estimate(ours, Batches(ids, config.block_size, 12, seed=7), 200, COURSE)["val"]
    t2 = time.perf_counter()
    val_ref = estimate_loss(ref, torch_batches(Batches(ids, config.block_size, 12, seed=7)), 200)["val"]
    print(f"float32, {iters} iterations: PyTorch val {h_ref['val_loss'][-1]:.4f} (20 batches), {val_ref:.4f} (200); "
          f"course ({backend}) val {h_ours['val_loss'][-1]:.4f} (20), {val_ours:.4f} (200); "
          f"difference {abs(val_ours - val_ref):.1e}; wall {t1 - t0:.0f} s vs {t2 - t1:.0f} s")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", type=int, default=1, help="threads of torch, numpy's BLAS and Numba (default 1: "
                   "on a shared machine more threads spin-wait for each other; pass 2 on an idle one)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--curves", action="store_true")
    p.add_argument("--full-run", type=int, default=0, metavar="ITERS")
    p.add_argument("--backend", default="numba", help="backend of the full run")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ids, config = setup()
    if args.profile:
        for backend in ("numpy", "numba"):
            profile_step(config, ids, backend)
    elif args.curves:
        curves(config, ids)
    elif args.full_run:
        full_run(config, ids, args.full_run, args.backend)
    else:
        ms = timed_steps(config, ids, args.steps)
        print(f"nanoGPT CPU config, float32, {args.steps} interleaved steps each (median ms per step), "
              f"torch threads {args.threads}:")
        for name, t in ms.items():
            print(f"  {name:8s} {t:8.1f} ms   {t / ms['pytorch']:5.2f}x PyTorch")


if __name__ == "__main__":
    main()
