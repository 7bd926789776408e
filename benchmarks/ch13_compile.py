"""Chapter 13: a training step compiled by the course's compiler, against the eager library and PyTorch.

Two models, each from the same initial weights on the same batches, with their steps interleaved (one step
of each contestant in turn, so load on the machine hits them alike), one thread for BLAS, Numba and torch:

- chapter 02's digits MLP (64-128-64-10, batch 64, Adam): the eager numpy backend, the compiled step,
  PyTorch eager, torch.compile;
- the capstone GPT in nanoGPT's CPU configuration (4 layers, 4 heads, 128 wide, block 64, batch 12,
  float32, AdamW, clipping at 1.0): the eager numpy and Numba backends (chapter 12's train_step), the
  compiled step (gpt.trainer.train_step on compiler.capturable.CAPTURABLE: the same step, with its
  changing numbers in tensors),
  PyTorch eager (chapter 04's GPT and step), torch.compile of chapter 04's GPT.

It prints the median ms per step and the ratios, then for the GPT: launches per step before fusion (the
eager step's backend calls) and after (the program's calls, by kind); memory of a step (the eager step's
peak of numpy allocations, the program's arena against one buffer per value, and what a replay
allocates); the time to compile the first capture, and what a second compile of a new model of the same
configuration compiles (nothing: its kernels are reused).

    python benchmarks/ch13_compile.py [--model mlp|gpt|both] [--steps 20] [--threads 1] [--no-torch-compile]
                                      [--cold]     # compile into an empty kernel cache (the first compile's
                                                   # true cost), then count what a new process compiles
"""

import argparse
import os
import subprocess
import sys
import tempfile

import common  # first: the thread pools of numpy, torch and Numba read their thread count once, at import

THREADS = common.pin_threads()

import collections  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import course_lib.tensor as ct  # noqa: E402
from course_lib import compiler  # noqa: E402
from course_lib.capstone import GPT  # noqa: E402
from course_lib.capstone import configure_optimizer as course_optimizer  # noqa: E402
from course_lib.capstone import train_step as eager_gpt_step  # noqa: E402
from course_lib.compiler import capturable, kernels  # noqa: E402
from course_lib.compiler.capturable import CAPTURABLE  # noqa: E402
from course_lib.data import load_digits, load_text  # noqa: E402
from course_lib.gpt import TrainConfig, make_get_batch  # noqa: E402
from course_lib.gpt import configure_optimizer as recipe_optimizer  # noqa: E402
from course_lib.gpt import configure_optimizer as torch_optimizer  # noqa: E402
from course_lib.gpt import train_step as recipe_step  # noqa: E402
from course_lib.gpt import train_step as torch_gpt_step  # noqa: E402
from course_lib.gpt.model import GPT as TorchGPT  # noqa: E402
from course_lib.gpt.model import GPTConfig  # noqa: E402
from course_lib.gpt.tokenizers import CharTokenizer  # noqa: E402
from course_lib.tensor.backend import Backend, current_backend, register_backend, use_backend  # noqa: E402

torch.set_num_threads(THREADS)
SIZES = (64, 128, 64, 10)


def interleaved(contestants, batches, warmup):
    """Median ms per step of each contestant, {name: (step(batch), setup)}, one step of each in turn."""
    times = {name: [] for name in contestants}
    for i, batch in enumerate(batches):
        for name, step in contestants.items():
            start = time.perf_counter()
            step(*batch)
            if i >= warmup:
                times[name].append(1000 * (time.perf_counter() - start))
    return {name: float(np.median(ts)) for name, ts in times.items()}


def try_torch_compile(model, step, example):
    """torch.compile of the model, warmed up on one batch; None (and why) where it does not run here."""
    try:
        compiled = torch.compile(model)
        start = time.perf_counter()
        step(compiled, *example)
        return compiled, time.perf_counter() - start, None
    except Exception as e:  # noqa: BLE001 - no C++ compiler, an unsupported platform, ...
        return None, 0.0, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def report(title, ms, base="PyTorch eager"):
    print(f"\n{title}\n  {'ms per step':28s} {'':>9s} {'/ ' + base:>18s}")
    for name, value in ms.items():
        print(f"  {name:28s} {value:9.3f} {value / ms[base]:18.2f}")


# ---- the digits MLP ---------------------------------------------------------------------------------

def mlp_weights(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for a, b in zip(SIZES, SIZES[1:]):
        bound = 1 / np.sqrt(a)
        out.append((rng.uniform(-bound, bound, (b, a)).astype(np.float32), rng.uniform(-bound, bound, b).astype(np.float32)))
    return out


def course_mlp(optimizer):
    layers = []
    for W, b in mlp_weights():
        lin = ct.nn.Linear(W.shape[1], W.shape[0])
        lin.weight.copy_(ct.Tensor(W))
        lin.bias.copy_(ct.Tensor(b))
        layers += [lin, ct.nn.ReLU()]
    model = ct.nn.Sequential(*layers[:-1])
    return model, optimizer(model.parameters(), lr=1e-3)


def torch_mlp():
    layers = []
    for W, b in mlp_weights():
        lin = torch.nn.Linear(W.shape[1], W.shape[0])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(W))
            lin.bias.copy_(torch.from_numpy(b))
        layers += [lin, torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def mlp_step(model, opt, x, y):
    loss = ct.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def torch_mlp_step(model, opt, x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def run_mlp(steps, use_torch_compile):
    X, _, y, _ = load_digits()
    rng = np.random.default_rng(0)
    batches = []
    while len(batches) < steps + 10:
        order = rng.permutation(len(X))
        batches += [(X[order[i:i + 64]], y[order[i:i + 64]]) for i in range(0, len(X) - 63, 64)]
    batches = batches[:steps + 10]
    eager_model, eager_opt = course_mlp(ct.optim.Adam)
    comp_model, comp_opt = course_mlp(capturable.Adam)
    compiled = compiler.compile(mlp_step, verbose=False)
    tm, topt = torch_mlp()
    contestants = {
        "course, eager (numpy)": lambda x, yb: mlp_step(eager_model, eager_opt, ct.Tensor(x), yb),
        "course, compiled": lambda x, yb: compiled(comp_model, comp_opt, ct.Tensor(x), yb),
        "PyTorch eager": lambda x, yb: torch_mlp_step(tm, topt, torch.from_numpy(x), torch.from_numpy(yb)),
    }
    if use_torch_compile:
        cm, copt = torch_mlp()
        cmodel, seconds, why = try_torch_compile(cm, lambda m, x, yb: torch_mlp_step(m, copt, x, yb),
                                                 (torch.from_numpy(batches[0][0]), torch.from_numpy(batches[0][1])))
        if cmodel is None:
            print(f"torch.compile does not run here: {why}")
        else:
            print(f"torch.compile of the MLP: {seconds:.1f} s for its first step")
            contestants["torch.compile"] = lambda x, yb: torch_mlp_step(cmodel, copt, torch.from_numpy(x), torch.from_numpy(yb))
    with use_backend("numpy"):
        ms = interleaved(contestants, batches, warmup=10)
    report(f"Digits MLP 64-128-64-10, batch 64, Adam, float32, median of {steps} steps", ms)
    print(f"  compiled / eager numpy: {ms['course, eager (numpy)'] / ms['course, compiled']:.2f}x faster "
          f"(goal: 3x); compiled / PyTorch eager: {ms['PyTorch eager'] / ms['course, compiled']:.2f}x faster (goal: > 1)")
    a = mlp_step(eager_model, eager_opt, ct.Tensor(batches[0][0]), batches[0][1]).item()
    b = compiled(comp_model, comp_opt, ct.Tensor(batches[0][0]), batches[0][1]).item()
    print(f"  loss of one more step: eager {a:.6f}, compiled {b:.6f}")


# ---- the GPT ------------------------------------------------------------------------------------------

class CountingBackend(Backend):
    """Delegates to the backend current when it was made, counting each call by method."""

    name = "count"

    def __init__(self):
        self.inner, self.calls = None, collections.Counter()

    def _count(self, method, *args):
        self.calls[method] += 1
        return getattr(self.inner, method)(*args)

    def map(self, op, a, out=None):
        return self._count("map", op, a, out)

    def zip(self, op, a, b, out=None):
        return self._count("zip", op, a, b, out)

    def reduce(self, op, a, dim):
        return self._count("reduce", op, a, dim)

    def matmul(self, a, b):
        return self._count("matmul", a, b)

    def where(self, cond, a, b):
        return self._count("where", cond, a, b)


def gpt_setup():
    text = load_text()
    tok = CharTokenizer(text)
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
    return tok.encode(text), config


def run_gpt(steps, use_torch_compile):
    ids, config = gpt_setup()
    cfg = TrainConfig()
    torch.manual_seed(1337)
    reference = TorchGPT(config)
    get_batch = make_get_batch(ids, config.block_size, 12, seed=1)
    batches = [tuple(t.numpy() for t in get_batch("train")) for _ in range(steps + 5)]
    models = {}
    for name in ("numpy", "numba", "compiled"):
        model = GPT.from_torch(reference)
        opt = recipe_optimizer(model, cfg, CAPTURABLE) if name == "compiled" else course_optimizer(model, cfg)
        models[name] = (model, opt)
    compiled = compiler.compile(recipe_step, verbose=False)
    theirs = TorchGPT(config)
    theirs.load_state_dict(reference.state_dict())
    topt = torch_optimizer(theirs, cfg)

    def eager(backend):
        model, opt = models[backend]

        def step(x, y):
            with use_backend(backend):
                eager_gpt_step(model, opt, x, y, cfg.grad_clip)
        return step

    start = time.perf_counter()
    kernels_before = dict(kernels.STATS)
    while compiled.program is None:
        compiled(*models["compiled"], *batches[0], cfg.grad_clip, CAPTURABLE)
    first_compile = time.perf_counter() - start
    made = {k: kernels.STATS[k] - kernels_before[k] for k in kernels.STATS}
    contestants = {
        "course, eager (numpy)": eager("numpy"),
        "course, eager (Numba)": eager("numba"),
        "course, compiled": lambda x, y: compiled(*models["compiled"], x, y, cfg.grad_clip, CAPTURABLE),
        "PyTorch eager": lambda x, y: torch_gpt_step(theirs, topt, torch.from_numpy(x), torch.from_numpy(y), cfg.grad_clip),
    }
    if use_torch_compile:
        cm = TorchGPT(config)
        cm.load_state_dict(reference.state_dict())
        copt = torch_optimizer(cm, cfg)
        example = (torch.from_numpy(batches[0][0]), torch.from_numpy(batches[0][1]))
        cmodel, seconds, why = try_torch_compile(cm, lambda m, x, y: torch_gpt_step(m, copt, x, y, cfg.grad_clip), example)
        if cmodel is None:
            print(f"torch.compile does not run here: {why}")
        else:
            print(f"torch.compile of chapter 04's GPT: {seconds:.1f} s for its first step")
            contestants["torch.compile"] = lambda x, y: torch_gpt_step(cmodel, copt, torch.from_numpy(x),
                                                                        torch.from_numpy(y), cfg.grad_clip)
    ms = interleaved(contestants, batches, warmup=3)
    report(f"Capstone GPT, nanoGPT's CPU configuration, float32, median of {steps} steps", ms)
    print(f"  compiled / eager numpy: {ms['course, eager (numpy)'] / ms['course, compiled']:.2f}x faster (goal: 2x); "
          f"compiled / PyTorch eager: {ms['PyTorch eager'] / ms['course, compiled']:.2f}x faster (goal: >= 1)")

    program = compiled.program
    counter = CountingBackend()
    register_backend(counter.name, counter)
    model, opt = models["numpy"]
    counter.inner = current_backend()
    with use_backend(counter.name):
        eager_gpt_step(model, opt, *batches[1], cfg.grad_clip)
    kinds = program.counts()
    print(f"\nLaunches per step: eager {sum(counter.calls.values())} backend calls "
          f"({', '.join(f'{k} {v}' for k, v in counter.calls.most_common())}); "
          f"compiled {len(program.launches)} ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))})")
    fused = [launch for launch in program.kernels if len(launch.nodes) > 1]
    print(f"  {sum(len(launch.nodes) for launch in fused)} of the program's {len(program.graph.nodes)} captured ops run "
          f"in {len(fused)} fused kernels")

    with use_backend("numpy"):
        eager_gpt_step(model, opt, *batches[2], cfg.grad_clip)
        tracemalloc.start()
        eager_gpt_step(model, opt, *batches[3], cfg.grad_clip)
        _, eager_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    tracemalloc.start()
    compiled(*models["compiled"], *batches[3], cfg.grad_clip, CAPTURABLE)
    _, replay_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    pinned = sum(program.arrays[b.id].nbytes for b in program.graph.buffers
                 if b.id in program.arrays and b.kind == "temp" and b.array is not None and program.arrays[b.id] is b.array)
    print(f"\nMemory of a step: eager numpy step, peak of numpy allocations {eager_peak / 1e6:.1f} MB; compiled: "
          f"one buffer per value {program.naive_bytes / 1e6:.1f} MB, the plan's arena {program.arena_bytes() / 1e6:.1f} MB "
          f"(+ {pinned / 1e6:.1f} MB held by the model and optimizer: gradients, moments); a replay allocates "
          f"{replay_peak / 1e3:.1f} kB")

    print(f"\nCompile: first capture to program {first_compile:.1f} s (kernels compiled {made['compiled']}, loaded from "
          f"disk {made['loaded']}, reused {made['reused']})")
    again = compiler.compile(recipe_step, verbose=False)
    model2 = GPT.from_torch(reference)
    opt2 = recipe_optimizer(model2, cfg, CAPTURABLE)
    before = dict(kernels.STATS)
    start = time.perf_counter()
    while again.program is None:
        again(model2, opt2, *batches[0], cfg.grad_clip, CAPTURABLE)
    print(f"  a second model of the same configuration: {time.perf_counter() - start:.1f} s to its program; kernels "
          f"compiled {kernels.STATS['compiled'] - before['compiled']}, loaded {kernels.STATS['loaded'] - before['loaded']}, "
          f"reused {kernels.STATS['reused'] - before['reused']}")


def compile_only():
    """In a process of its own: compile the GPT step once, print what was compiled and loaded from disk."""
    ids, config = gpt_setup()
    torch.manual_seed(1337)
    model = GPT.from_torch(TorchGPT(config))
    opt = recipe_optimizer(model, TrainConfig(), CAPTURABLE)
    get_batch = make_get_batch(ids, config.block_size, 12, seed=1)
    step = compiler.compile(recipe_step, verbose=False)
    start = time.perf_counter()
    while step.program is None:
        step(model, opt, *(t.numpy() for t in get_batch("train")), 1.0, CAPTURABLE)
    print(f"  a new process: {time.perf_counter() - start:.1f} s to its program; kernels compiled "
          f"{kernels.STATS['compiled']}, loaded from disk {kernels.STATS['loaded']}, reused {kernels.STATS['reused']}")


def main():
    if "--compile-only" in sys.argv:
        return compile_only()
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=("mlp", "gpt", "both"), default="both")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="read before numpy, Numba and torch start their pools")
    p.add_argument("--no-torch-compile", action="store_true")
    p.add_argument("--cold", action="store_true", help="generated kernels go to an empty cache folder")
    args = p.parse_args()
    if args.cold:
        os.environ["COURSE_COMPILER_CACHE"] = tempfile.mkdtemp(prefix="course-kernels-")
    print(f"{THREADS} thread(s) for BLAS, Numba and torch; torch {torch.__version__}; CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}")
    if args.model in ("mlp", "both"):
        run_mlp(args.steps * 20, not args.no_torch_compile)
    if args.model in ("gpt", "both"):
        run_gpt(args.steps, not args.no_torch_compile)
        subprocess.run([sys.executable, __file__, "--compile-only", "--threads", str(THREADS)], check=True)


if __name__ == "__main__":
    main()
