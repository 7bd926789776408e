"""Chapter 10 benchmark: the course's fused selective scan against chapter 05's sequential loop, side by side.

    python benchmarks/ch10_scan.py                 # b = 1, L = 1024, D = 256, N = 16, float32: 5 runs
    python benchmarks/ch10_scan.py --runs 7 --rounds 15 --L 256 1024 4096
    python benchmarks/ch10_scan.py --solutions     # also the solved notebook's fused_scan, kernel against kernel

The goal (issue 33): the fused forward at least 10x chapter 05's loop, forward + backward at least 5x,
at the default size, on every run. For each size and pass (the forward under no_grad; forward + backward
with autograd on all six inputs), a run times the contestants in turns, `--rounds` times, and keeps each
one's best round: other work on the machine only adds time, and taking turns spreads a burst of it over
all the contestants alike. The script makes `--runs` such runs and prints each run's ratio, then the
smallest, the median and the largest: the spread is the point. The loop's L small steps each wait for a
core, so on a shared machine its time (and the ratio) swings the most.

--solutions adds the reference answer of exercise 2 (solutions/10_fused_kernels.ipynb), timed against the
course's kernel on the same numpy inputs, forward only (the exercise has no backward): the goal is within 2x.
Threads: torch and Numba use their defaults (all cores) unless --threads says otherwise.
"""

import argparse
import statistics

import common  # first: idle OpenMP threads sleep instead of spinning on the cores
import numba  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from course_lib.fused import scan_cpu  # noqa: E402
from course_lib.fused.scan_op import CHUNK, selective_scan_fused  # noqa: E402
from course_lib.mamba.scan import selective_scan_sequential  # noqa: E402


def inputs(b, L, D, N, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)   # noqa: E731
    return r(b, L, D), torch.nn.functional.softplus(r(b, L, D) - 2), -torch.exp(r(D, N) * 0.5), r(b, L, N), r(b, L, N), r(D)


def forward(scan, args):
    @torch.no_grad()
    def run():
        scan(*args)
    return run


def forward_backward(scan, args):
    leaves = [a.clone().requires_grad_() for a in args]
    dy = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(1))

    def run():
        scan(*leaves).backward(dy)
        for leaf in leaves:
            leaf.grad = None
    return run


def report(title, runs, peer, ours, goal=None):
    """One line per run, then the spread of the ratio peer / ours."""
    ratios = [r[peer] / r[ours] for r in runs]
    print(title)
    for k, r in enumerate(runs):
        times = "  ".join(f"{n} {t * 1e3:8.2f} ms" for n, t in r.items())
        print(f"  run {k + 1}: {times}   {peer} / {ours}: {ratios[k]:5.2f}x")
    missed = 0 if goal is None else sum(x < goal for x in ratios)
    verdict = "" if goal is None else f"   goal >= {goal}x: " + (f"NOT met on {missed} of {len(ratios)} runs" if missed
                                                                  else "met on every run")
    print(f"  {peer} / {ours}: min {min(ratios):.2f}x, median {statistics.median(ratios):.2f}x, max {max(ratios):.2f}x{verdict}")
    return ratios


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--L", type=int, nargs="+", default=[1024], help="sequence lengths (default 1024)")
    p.add_argument("--b", type=int, default=1)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--solutions", action="store_true", help="also time the solved notebook's fused_scan")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        numba.set_num_threads(args.threads)
    D, N = 256, 16
    print(f"selective scan, b = {args.b}, D = {D}, N = {N}, float32; torch threads {torch.get_num_threads()}, "
          f"numba threads {numba.get_num_threads()}; {args.runs} runs of the best of {args.rounds} rounds in turns")
    solution = None
    if args.solutions:
        from ch10_solutions import solution_kernels

        solution = solution_kernels()["fused_scan"]
    for L in args.L:
        x = inputs(args.b, L, D, N)
        err = (selective_scan_fused(*x) - selective_scan_sequential(*x)).abs().max().item()
        print(f"\nL = {L}: fused vs chapter 05's loop, largest difference {err:.0e} (float32)")
        contestants = {"loop": selective_scan_sequential, "fused": selective_scan_fused}
        for title, make, goal in (("forward", forward, 10), ("forward + backward", forward_backward, 5)):
            runs = [common.best_in_turns({n: make(s, x) for n, s in contestants.items()}, args.rounds) for _ in range(args.runs)]
            report(f"{title}:", runs, "loop", "fused", goal if L == 1024 and args.b == 1 else None)
        if solution is not None:
            arrays = [t.numpy() for t in x]
            outs = [np.empty((args.b, L, D), np.float32), np.empty((args.b, D, N), np.float32),
                    np.empty((args.b, -(-L // CHUNK), D, N), np.float32)]
            kernels = {"course": scan_cpu.scan_forward, "solution": solution}
            calls = {n: (lambda k=k: k(*arrays, *outs, CHUNK)) for n, k in kernels.items()}
            runs = [common.best_in_turns(calls, args.rounds)
                    for _ in range(args.runs)]
            ratios = report("the solved notebook's fused_scan against the course's kernel, forward:", runs, "solution", "course")
            missed = sum(x > 2 for x in ratios)
            print(f"  solution / course, worst run: {max(ratios):.2f}   goal <= 2: "
                  + (f"NOT met on {missed} of {len(ratios)} runs" if missed else "met on every run"))


if __name__ == "__main__":
    main()
