"""The course GPT's training step against nanoGPT's own model.py, side by side in one run.

nanoGPT's README CPU configuration: 4 layers, 4 heads, 128 wide, block 64, batch 12, dropout 0,
AdamW (betas 0.9, 0.99, weight decay 0.1 on matrices), lr 1e-3 with 100 warmup steps and a cosine
to 1e-4 at 2000, gradient clipping at 1.0; the course's char-level corpus. nanoGPT is not part of
the course: pass the path of its model.py (a clone of github.com/karpathy/nanoGPT); nothing is
downloaded.

    python benchmarks/ch04_vs_nanogpt.py --nanogpt ~/nanoGPT/model.py [--steps 200] [--threads 2]

On a machine that other work keeps busy, `--threads 1 --clock cpu` times each phase by the CPU time
of the one thread that runs it (time.thread_time), which waiting for a core does not inflate; the
figures still rise somewhat, as the other work shares the caches and memory bandwidth.

Contestants, all trained from the same initial weights on the same batches with the same learning
rate schedule, one step of each in turn (so a busy moment of the machine slows all of them alike):

  nanoGPT bias=False        nanoGPT's model and its configure_optimizers, as its README runs it
  course, nanoGPT's math    GPTConfig(bias=False, gelu="none"): the same function as nanoGPT's model
  course bias=False         GPTConfig(bias=False): GPT-2's tanh GELU, no biases
  course (GPT-2)            GPTConfig(): GPT-2's biases and tanh GELU, the chapter's model
  nanoGPT bias=True         nanoGPT's model with biases

A step is what nanoGPT's train.py times: forward, zero_grad, backward, clip, optimizer step, loss.item().
Each step is split into those phases too (the profile), and the ratios are medians over the steps of
(course step / nanoGPT step in the same round). The losses after the last step show that the runs
computed the same thing: nanoGPT's math and nanoGPT's model differ only by the optimizers' rounding.
"""

import argparse
import contextlib
import importlib.util
import io
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from course_lib.data import load_text
from course_lib.gpt import TrainConfig, configure_optimizer, lr_at, make_get_batch
from course_lib.gpt.model import GPT, GPTConfig
from course_lib.gpt.tokenizers import CharTokenizer

PHASES = ("forward", "backward", "clip", "update")


def load_nanogpt(path):
    """nanoGPT's model module, imported from the file the user named (never fetched)."""
    path = Path(path).expanduser()
    path = path / "model.py" if path.is_dir() else path
    if not path.is_file():
        sys.exit(f"--nanogpt: no model.py at {path}")
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def timed_step(model, optimizer, x, y, lr, phases, clock=time.perf_counter):
    """One training step, as nanoGPT's train.py runs it, with the time of each phase appended to `phases`."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    t0 = clock()
    _, loss = model(x, y)
    t1 = clock()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    t2 = clock()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    t3 = clock()
    optimizer.step()
    value = loss.item()
    t4 = clock()
    for name, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
        phases[name].append(1e3 * dt)
    return value


def contestants(nano, vocab_size, cfg):
    """{name: (model, optimizer)}, every model starting from nanoGPT's initial weights where they exist."""
    shape = dict(vocab_size=vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
    runs = {}
    for bias in (False, True):
        torch.manual_seed(1337)
        model = nano.GPT(nano.GPTConfig(**shape, bias=bias))
        optimizer = model.configure_optimizers(cfg.weight_decay, cfg.lr, tuple(cfg.betas), "cpu")
        runs[f"nanoGPT bias={bias}"] = (model, optimizer)
    start = {bias: runs[f"nanoGPT bias={bias}"][0].state_dict() for bias in (False, True)}
    for name, kw in (("course, nanoGPT's math", dict(bias=False, gelu="none")),
                     ("course bias=False", dict(bias=False)),
                     ("course (GPT-2)", dict())):
        model = GPT(GPTConfig(**shape, **kw))
        model.load_state_dict(start[model.config.bias])   # the same names and shapes as nanoGPT's
        runs[name] = (model, configure_optimizer(model, cfg))
    order = ["nanoGPT bias=False", "course, nanoGPT's math", "course bias=False", "course (GPT-2)",
             "nanoGPT bias=True"]
    return {name: runs[name] for name in order}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nanogpt", required=True, help="path to nanoGPT's model.py (or the folder holding it)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10, help="steps run first and not timed")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: the thread's CPU time (only with --threads 1; for a busy machine)")
    args = p.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        sys.exit("--clock cpu measures one thread: use it with --threads 1")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    nano = load_nanogpt(args.nanogpt)

    text = load_text()
    tok = CharTokenizer(text)
    ids = torch.tensor(tok.encode(text))
    cfg = TrainConfig(batch_size=12, lr=1e-3, min_lr=1e-4, warmup_iters=100, lr_decay_iters=2000)
    with contextlib.redirect_stdout(io.StringIO()):   # nanoGPT prints its parameter counts
        runs = contestants(nano, tok.vocab_size, cfg)
    print(f"{cpu_name()}; torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}), "
          f"{args.threads} threads, {args.clock} clock; {args.steps} timed steps after {args.warmup}, contestants in turn")

    get_batch = make_get_batch(ids, 64, cfg.batch_size, seed=1)
    phases = {name: {ph: [] for ph in PHASES} for name in runs}
    losses = {name: None for name in runs}
    for model, _ in runs.values():
        model.train()
    for it in range(args.warmup + args.steps):
        x, y = get_batch("train")
        lr = lr_at(it, cfg)
        for name, (model, optimizer) in runs.items():
            losses[name] = timed_step(model, optimizer, x, y, lr, phases[name], clock)
    steps = {name: [sum(v) for v in zip(*(ph[k][args.warmup:] for k in PHASES))] for name, ph in phases.items()}

    print(f"\n{'ms per step (median)':<26}" + "".join(f"{ph:>10}" for ph in PHASES) + f"{'step':>10}{'loss':>9}")
    for name in runs:
        cells = "".join(f"{statistics.median(phases[name][ph][args.warmup:]):>10.2f}" for ph in PHASES)
        print(f"{name:<26}{cells}{statistics.median(steps[name]):>10.2f}{losses[name]:>9.4f}")

    def ratios(a, b):
        return [s / t for s, t in zip(steps[a], steps[b])]

    print("\nratios (median over steps of the per-round ratio, and its lowest and highest; lower is faster)")
    for course, peer, goal in (("course, nanoGPT's math", "nanoGPT bias=False", "the same function"),
                               ("course bias=False", "nanoGPT bias=False", "goal: at most 1.0"),
                               ("course (GPT-2)", "nanoGPT bias=True", "goal: at most 1.05"),
                               ("course (GPT-2)", "nanoGPT bias=False", "biases and GELU cost")):
        r = ratios(course, peer)
        print(f"  {course:<24} / {peer:<20} {statistics.median(r):6.3f}  ({min(r):.3f}-{max(r):.3f})   ({goal})")


if __name__ == "__main__":
    main()
