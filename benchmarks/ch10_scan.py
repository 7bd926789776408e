"""Chapter 10 benchmark: the fused selective scan against chapter 05's sequential loop and chunked scan.

    python benchmarks/ch10_scan.py            # L = 256, 1024, 4096; batch 1 and 8; D = 256, N = 16
    python benchmarks/ch10_scan.py --quick    # L = 256 and 1024, batch 1: a smoke test

float32 on the CPU, side by side in one run: for each size, the forward alone (no autograd) and the
forward + backward (autograd on all six inputs), as wall times in ms (the best of a few runs), and
the ratios sequential / fused and chunked / fused. The peers build (b, L, D, N) tensors, four bytes
each: where one of them would pass PEER_LIMIT the peers are skipped ("-"); the fused scan never
builds one. The first fused call compiles (or loads from the cache) the Numba kernels: the warm-up
call before timing absorbs it.
"""

import argparse
import time

import numba
import torch

from course_lib.fused.scan_op import selective_scan_fused
from course_lib.mamba.scan import selective_scan_chunked, selective_scan_sequential

PEER_LIMIT = 2**25     # elements of one (b, L, D, N) tensor (128 MiB in float32)


def timeit(fn, repeat, budget=0.5):
    """The best wall time in seconds of at least `repeat` calls (more while under `budget` seconds, at
    most 30), after one warm-up call. The best, not the mean: other work on the machine only adds time."""
    fn()
    best, spent, runs = float("inf"), 0.0, 0
    while runs < repeat or (spent < budget and runs < 30):
        t0 = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - t0
        best, spent, runs = min(best, elapsed), spent + elapsed, runs + 1
    return best


def make_inputs(b, L, D, N, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)   # noqa: E731
    x, delta = r(b, L, D), torch.nn.functional.softplus(r(b, L, D) - 2)
    return x, delta, -torch.exp(r(D, N) * 0.5), r(b, L, N), r(b, L, N), r(D)


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


def bench(lengths, batches, D=256, N=16):
    print(f"{'b':>3} {'L':>5} {'pass':>8} {'sequential ms':>14} {'chunked ms':>11} {'fused ms':>9} "
          f"{'seq / fused':>12} {'chunked / fused':>16}")
    for b in batches:
        for L in lengths:
            args = make_inputs(b, L, D, N)
            peers = b * L * D * N <= PEER_LIMIT
            y, y_ref = selective_scan_fused(*args), selective_scan_sequential(*args) if peers else None
            err = f"(max |fused - sequential| {(y - y_ref).abs().max().item():.1e})" if peers else "(peers skipped: too big)"
            repeat = 2 if b * L >= 4096 else 3
            for name, make in (("forward", forward), ("fwd+bwd", forward_backward)):
                t_fused = timeit(make(selective_scan_fused, args), repeat)
                row = f"{b:>3} {L:>5} {name:>8} "
                if peers:
                    t_seq = timeit(make(selective_scan_sequential, args), repeat)
                    t_chk = timeit(make(selective_scan_chunked, args), repeat)
                    row += (f"{1e3 * t_seq:>14.1f} {1e3 * t_chk:>11.1f} {1e3 * t_fused:>9.2f} "
                            f"{t_seq / t_fused:>11.1f}x {t_chk / t_fused:>15.1f}x")
                else:
                    row += f"{'-':>14} {'-':>11} {1e3 * t_fused:>9.2f} {'-':>12} {'-':>16}"
                print(row + ("   " + err if name == "forward" else ""))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="L = 256 and 1024, batch 1")
    args = p.parse_args()
    print(f"selective scan, D 256, N 16, float32, CPU: torch threads {torch.get_num_threads()}, "
          f"numba threads {numba.get_num_threads()}")
    bench([256, 1024] if args.quick else [256, 1024, 4096], [1] if args.quick else [1, 8])


if __name__ == "__main__":
    main()
