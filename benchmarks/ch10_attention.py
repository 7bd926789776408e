"""Chapter 10 benchmark: the course's FlashAttention kernels against PyTorch's SDPA on the CPU, side by side.

    python benchmarks/ch10_attention.py                  # causal, B = 1, H = 4, T = 2048, d = 64, float32; 5 runs
    python benchmarks/ch10_attention.py --T 512 1024 2048 --runs 7 --rounds 10
    python benchmarks/ch10_attention.py --solutions      # also the solved notebook's kernels, kernel against kernel
    python benchmarks/ch10_attention.py --memory-only    # the memory curve alone (up to T = 16384)

Time. The goals (issue 33): the course's op (`course_lib.fused.attention_op.attention`) within 1.3x of
F.scaled_dot_product_attention's time forward and within 1.5x forward + backward, causal, B = 1, H = 4,
T = 2048, d = 64, float32. A run times the contestants in turns, `--rounds` times, and keeps each one's
best round; the script makes `--runs` runs and prints each run's ratio, then the smallest, the median and
the largest. Wall time, with torch and Numba on the same threads (all cores by default).

Memory. What each call allocates while it runs, measured with tracemalloc (it sees numpy's and Numba's
allocations, not PyTorch's: see course_lib/memory.py): the course's forward kernel and its
backward kernel up to T = 16384, against naive attention in numpy (the (H, T, T) scores) up to T = 4096,
with the exponent of the growth fitted over the sizes. The goals: the forward's scratch flat in T (its tasks'
tiles, an exponent near 0), the backward's O(T d) (an exponent near 1), naive attention's O(T^2).

--solutions adds the reference answers of exercises 3 and 4 (solutions/10_fused_kernels.ipynb), timed against
the course's kernels on the same numpy inputs with the same tiles: the goal is within 2x.
"""

import argparse
import statistics

import common  # first: idle OpenMP threads sleep instead of spinning on the cores
import numba  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from course_lib.fused import attention_cpu  # noqa: E402
from course_lib.fused.attention_memory import naive_attention  # noqa: E402
from course_lib.fused.attention_op import attention  # noqa: E402
from course_lib.memory import growth, peak_bytes  # noqa: E402


def report(title, runs, ours, peer, goal=None):
    """One line per run, then the spread of the ratio ours / peer (time over time)."""
    ratios = [r[ours] / r[peer] for r in runs]
    print(title)
    for k, r in enumerate(runs):
        times = "  ".join(f"{n} {t * 1e3:8.2f} ms" for n, t in r.items())
        print(f"  run {k + 1}: {times}   {ours} / {peer}: {ratios[k]:5.2f}")
    missed = 0 if goal is None else sum(x > goal for x in ratios)
    verdict = "" if goal is None else f"   goal <= {goal}: " + (f"NOT met on {missed} of {len(ratios)} runs" if missed
                                                                 else "met on every run")
    print(f"  {ours} / {peer}: min {min(ratios):.2f}, median {statistics.median(ratios):.2f}, max {max(ratios):.2f}{verdict}")


def qkv(T, B=1, H=4, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, d, generator=g) for _ in range(4)]


def time_ops(T, runs, rounds):
    q, k, v, dout = qkv(T)
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)   # noqa: E731
    ours = lambda q, k, v: attention(q, k, v, causal=True)                            # noqa: E731
    with torch.no_grad():
        err = (ours(q, k, v) - sdpa(q, k, v)).abs().max().item()
    print(f"\nT = {T}: fused vs SDPA, largest difference {err:.0e} (float32)")

    def forward(fn):
        def run():
            with torch.no_grad():
                fn(q, k, v)
        return run

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def both(fn):
        return lambda: torch.autograd.grad(fn(*leaves), leaves, dout)

    goals = T == 2048
    for title, make, goal in (("forward:", forward, 1.3), ("forward + backward:", both, 1.5)):
        contestants = {"SDPA": make(sdpa), "fused": make(ours)}
        report(title, [common.best_in_turns(contestants, rounds) for _ in range(runs)], "fused", "SDPA",
               goal if goals else None)


def time_solutions(T, runs, rounds):
    from ch10_solutions import solution_kernels

    sol = solution_kernels()
    q, k, v, do = (t.numpy()[0] for t in qkv(T))
    out, lse = np.empty_like(q), np.empty(q.shape[:2], np.float32)
    grads = [np.empty_like(q) for _ in range(3)]
    scale = np.float32(q.shape[2] ** -0.5)
    attention_cpu.forward_kernel(q, k, v, out, lse, scale, True, *attention_cpu.FORWARD_TILES)
    for name, course, mine, args, tiles in (
            ("flash_forward", attention_cpu.forward_kernel, sol["flash_forward"], (q, k, v, out, lse),
             attention_cpu.FORWARD_TILES),
            ("flash_backward", attention_cpu.backward_kernel, sol["flash_backward"],
             (q, k, v, out.copy(), do, lse.copy(), *grads), attention_cpu.BACKWARD_TILES)):
        contestants = {"course": lambda f=course, a=args, t=tiles: f(*a, scale, True, *t),
                       "solution": lambda f=mine, a=args, t=tiles: f(*a, scale, True, *t)}
        report(f"the solved notebook's {name} against the course's kernel, T = {T} (goal: at most 2):",
               [common.best_in_turns(contestants, rounds) for _ in range(runs)], "solution", "course", 2.0)


def memory(Ts_fused, Ts_naive, H=4, d=64):
    """Bytes allocated while one call runs: the course's forward and backward kernels, naive attention."""
    rows = {"forward": [], "backward": [], "naive": []}
    for T in Ts_fused:
        g = np.random.default_rng(T)
        q, k, v, do = (g.standard_normal((H, T, d)).astype(np.float32) for _ in range(4))
        out, lse = np.empty_like(q), np.empty((H, T), np.float32)
        grads = [np.empty_like(q) for _ in range(3)]
        scale = np.float32(d ** -0.5)
        rows["forward"].append(peak_bytes(lambda: attention_cpu.forward_kernel(q, k, v, out, lse, scale, True,
                                                                               *attention_cpu.FORWARD_TILES)))
        rows["backward"].append(peak_bytes(lambda: attention_cpu.backward_kernel(q, k, v, out, do, lse, *grads, scale, True,
                                                                                 *attention_cpu.BACKWARD_TILES)))
        if T in Ts_naive:
            rows["naive"].append(peak_bytes(lambda: naive_attention(q, k, v, True), warm_up=False))
    print(f"\nmemory allocated while one call runs (tracemalloc: numpy and Numba), causal, {H} heads, d = {d}, float32")
    print(f"{'T':>6} {'forward':>12} {'backward':>12} {'naive':>12} {'one (H,T,T)':>12} {'q (H,T,d)':>10}")
    for i, T in enumerate(Ts_fused):
        naive = f"{rows['naive'][i] / 2**20:9.2f} MiB" if i < len(rows["naive"]) else f"{'-':>12}"
        print(f"{T:6d} {rows['forward'][i] / 2**20:8.2f} MiB {rows['backward'][i] / 2**20:8.2f} MiB {naive} "
              f"{H * T * T * 4 / 2**20:8.0f} MiB {H * T * d * 4 / 2**20:6.2f} MiB")
    print(f"growth exponent (bytes ~ T^p): forward {growth(Ts_fused, rows['forward']):.2f}, "
          f"backward {growth(Ts_fused, rows['backward']):.2f}, naive {growth(Ts_naive, rows['naive']):.2f} "
          f"(goals: forward about 0, its tiles; backward about 1, O(T d))")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, nargs="+", default=[2048])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--solutions", action="store_true", help="also time the solved notebook's kernels")
    p.add_argument("--memory-only", action="store_true")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--max-T", type=int, default=16384, help="the largest T of the memory curve")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        numba.set_num_threads(args.threads)
    print(f"attention, causal, B = 1, H = 4, d = 64, float32; torch threads {torch.get_num_threads()}, numba threads "
          f"{numba.get_num_threads()}; {args.runs} runs of the best of {args.rounds} rounds in turns")
    if not args.memory_only:
        for T in args.T:
            time_ops(T, args.runs, args.rounds)
            if args.solutions:
                time_solutions(T, args.runs, args.rounds)
    if not args.no_memory:
        Ts = [T for T in (1024, 2048, 4096, 8192, 16384) if T <= args.max_T]
        memory(Ts, [T for T in Ts if T <= 4096])


if __name__ == "__main__":
    main()
