"""Chapter 04's GPT on a learner's own library (chapter 12's payoff) against PyTorch and the course's backends.

The learner's library is assembled by `course_lib.yours.ch12_capstone` from the pieces saved in a workspace:
chapter 01's topological order, chapter 02's Mul, Sum, matmul_backward, cross-entropy and adam_step, chapter
06's kernels (the backend "yours-numba"), chapter 12's Functions and attention. By default the course's
reference answers of those four chapters are saved first into a temporary workspace, exactly as a learner's
passing checks save them (about a minute: the solved exercise notebooks run); --workspace DIR uses a
learner's work/ folder instead.

Four contestants start from the same weights and take the same batches, steps interleaved (a busy moment of
the machine hits them all), each the recipe's own step (gpt/trainer.train_step) on its library: PyTorch, the
course's GPT (its answers to chapter 12) on the numpy backend and on the course's Numba backend, and the
learner's GPT on the learner's library. nanoGPT's CPU configuration (4 layers, 4 heads, 128 wide, block 64,
batch 12, dropout 0). Prints the median ms per training step and the ratios; the course aims at 2x PyTorch
or less for the learner's library on one thread.

    python benchmarks/ch12_yours.py [--steps 20] [--dtype float32] [--threads 1]
    python benchmarks/ch12_yours.py --share        # one metered step: whose code computed it
    python benchmarks/ch12_yours.py --curves       # float64: 20 steps of the learner's train against chapter 04's
    python benchmarks/ch12_yours.py --full-run 2000   # float32: a whole run on the learner's library
    python benchmarks/ch12_yours.py --profile      # cProfile of one step on the learner's library
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def _threads_from_argv(default=1):
    """--threads N, read before numpy, Numba and torch start their thread pools (they read it once)."""
    args = sys.argv[1:]
    return int(args[args.index("--threads") + 1]) if "--threads" in args else default


THREADS = _threads_from_argv()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[var] = str(THREADS)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # idle torch threads sleep, as in the course's kernel

import numpy as np  # noqa: E402
import torch  # noqa: E402

from course_lib.data import load_text  # noqa: E402
from course_lib.gpt import TrainConfig, train  # noqa: E402
from course_lib.gpt.data import Batches  # noqa: E402
from course_lib.gpt.model import GPT as TorchGPT  # noqa: E402
from course_lib.gpt.model import GPTConfig  # noqa: E402
from course_lib.gpt.tokenizers import CharTokenizer  # noqa: E402

CHAPTERS = ("01", "02", "06", "12")


def workspace(folder):
    """COURSE_WORKSPACE for the learner's library: `folder`, or a temporary one with the reference answers."""
    if folder:
        os.environ["COURSE_WORKSPACE"] = str(Path(folder).resolve())
        return
    work = Path(tempfile.mkdtemp(prefix="ch12-yours-")) / "work"
    os.environ["COURSE_WORKSPACE"] = str(work)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import carried

    start = time.perf_counter()
    for chapter in CHAPTERS:
        carried.save_reference(chapter, work)
    print(f"the reference answers of chapters {', '.join(CHAPTERS)} saved as a learner's in {work} "
          f"({time.perf_counter() - start:.0f} s)")


def setup():
    text = load_text()
    tok = CharTokenizer(text)
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
    return tok.encode(text), config


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--threads", type=int, default=1, help="threads of torch, numpy's BLAS and Numba (default 1)")
    p.add_argument("--workspace", help="a learner's work/ folder (default: the reference answers, saved first)")
    p.add_argument("--share", action="store_true")
    p.add_argument("--curves", action="store_true")
    p.add_argument("--full-run", type=int, default=0, metavar="ITERS")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    workspace(args.workspace)
    from course_lib.yours import ch12_capstone as capstone
    from course_lib.yours import meter

    lib = capstone.assemble()
    ids, config = setup()
    dtype = np.float64 if args.dtype == "float64" or args.curves else np.float32
    torch_dtype = torch.float64 if dtype == np.float64 else torch.float32
    if args.share or args.profile:
        torch.manual_seed(1337)
        model = lib.GPT.from_torch(TorchGPT(config).to(torch_dtype))
        optimizer = lib.configure_optimizer(model, TrainConfig())
        x, y = Batches(ids, config.block_size, 12, seed=1).get("train")
        with lib.running():
            lib.step(model, optimizer, x, y)          # compiles the learner's kernels
        if args.share:
            print("\n".join(meter.describe(meter.measure_step(lib, model, optimizer, x, y))))
        else:
            import cProfile
            import pstats

            with lib.running():
                lib.step(model, optimizer, x, y)
                prof = cProfile.Profile()
                prof.enable()
                lib.step(model, optimizer, x, y)
                prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    elif args.curves:
        cfg = TrainConfig(max_iters=20, lr=1e-3, warmup_iters=10, lr_decay_iters=20, eval_interval=0, eval_iters=1)
        torch.manual_seed(1337)
        reference = TorchGPT(config).double()
        ours = lib.GPT.from_torch(reference)
        batches = Batches(ids, config.block_size, 12, seed=7)
        theirs = train(reference, lambda s: tuple(map(torch.from_numpy, batches.get(s))), cfg, progress=False)
        with lib.running():
            mine = lib.train(ours, lib.configure_optimizer(ours, cfg), Batches(ids, config.block_size, 12, seed=7), cfg)
        gap = np.abs(np.array(mine["loss"]) - np.array(theirs["loss"])).max()
        print(f"float64, 20 steps: losses {theirs['loss'][0]:.4f} -> {theirs['loss'][-1]:.4f}; the largest difference "
              f"from PyTorch's is below 1e-9: {gap < 1e-9} (below 1e-12: {gap < 1e-12})")
    elif args.full_run:
        cfg = TrainConfig(max_iters=args.full_run, lr=1e-3, min_lr=1e-4, warmup_iters=100,
                          lr_decay_iters=args.full_run, eval_interval=0, eval_iters=20)
        torch.manual_seed(1337)
        reference = TorchGPT(config)
        ours = lib.GPT.from_torch(reference)
        batches = Batches(ids, config.block_size, 12, seed=1337)
        start = time.perf_counter()
        h_ref = train(reference, lambda s: tuple(map(torch.from_numpy, batches.get(s))), cfg, progress=False)
        middle = time.perf_counter()
        with lib.running():
            h_ours = lib.train(ours, lib.configure_optimizer(ours, cfg), Batches(ids, config.block_size, 12, seed=1337),
                               cfg)
        end = time.perf_counter()
        print(f"float32, {args.full_run} iterations: PyTorch val {h_ref['val_loss'][-1]:.4f}, the learner's library "
              f"val {h_ours['val_loss'][-1]:.4f}; wall {middle - start:.0f} s vs {end - middle:.0f} s")
    else:
        ms = meter.time_steps(lib, config, ids, dtype, steps=args.steps, warmup=2)
        print(f"nanoGPT CPU config, {args.dtype}, {args.steps} interleaved steps each after 2 warm-up steps "
              f"(median ms per step), {args.threads} thread(s):")
        for name, t in ms.items():
            print(f"  {name:22s} {t:8.1f} ms   {t / ms['PyTorch']:5.2f}x PyTorch   "
                  f"{t / ms['course, Numba backend']:5.2f}x the course's Numba backend")

if __name__ == "__main__":
    main()
