"""Tiled attention (course_lib.fused) against naive attention and PyTorch's SDPA on the CPU, side by side.

    .venv/bin/python benchmarks/ch10_attention.py [--quick] [--causal] [--threads N] [--no-memory]

Batch 1, 4 heads, d = 64, float32, T = 256 ... 4096. For each T: the time of the fused Numba kernel,
of naive attention (the T x T scores in memory, `naive_attention`) and of
F.scaled_dot_product_attention, forward (under no_grad) and forward + backward, with the ratios
fused / SDPA and naive / SDPA. Then the extra memory each one needs at T = 512 ... 4096
(`memory_curve`: peak resident memory above the inputs, each method in a fresh process).

Times are the process's CPU time (time.process_time), the best of a few runs, so a machine shared
with other work does not inflate them; with more than one thread they add up the work of all threads.
Torch and Numba get the same thread count.
"""

import argparse
import os
import time

# OpenMP worker threads spin while idle by default, and that spinning would be counted as CPU time of
# whichever op runs next. Passive waiting keeps each measurement to its own work.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba
import torch
import torch.nn.functional as F

from course_lib.fused.attention_memory import memory_curve
from course_lib.fused.attention_op import attention, naive_attention

METHODS = {"fused": attention, "naive": naive_attention,
           "sdpa": lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal)}


def best_of(f, repeat, clock=time.process_time):
    """The best of `repeat` timings of f(), each over enough calls to last at least 50 ms."""
    f()
    calls, t = 1, clock()
    f()
    while clock() - t < 0.05 and calls < 1000:
        calls *= 2
        t = clock()
        for _ in range(calls):
            f()
    best = float("inf")
    for _ in range(repeat):
        t = clock()
        for _ in range(calls):
            f()
        best = min(best, (clock() - t) / calls)
    return best


def time_all(T, causal, repeat, backward):
    """{method: seconds} for one T, forward only or forward + backward."""
    g = torch.Generator().manual_seed(T)
    q, k, v, dout = (torch.randn(1, 4, T, 64, generator=g) for _ in range(4))
    times = {}
    for name, fn in METHODS.items():
        if backward:
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
            times[name] = best_of(lambda: torch.autograd.grad(fn(q, k, v, causal), (q, k, v), dout), repeat)
        else:
            with torch.no_grad():
                times[name] = best_of(lambda: fn(q, k, v, causal), repeat)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="T = 256, 1024, 2048 only, fewer runs, less memory")
    ap.add_argument("--causal", action="store_true", help="with the causal mask (half the work)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--no-memory", action="store_true", help="skip the memory curve")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    Ts = [256, 1024, 2048] if args.quick else [256, 512, 1024, 2048, 4096]
    repeat = 2 if args.quick else 5
    print(f"B=1 H=4 d=64 float32, {'causal' if args.causal else 'no mask'}; threads: {args.threads}; "
          f"best of {repeat}; CPU ms per call; ratio = method / SDPA")
    for backward in (False, True):
        print(f"\n{'forward + backward' if backward else 'forward'}")
        print(f"{'T':>6s} {'SDPA':>9s} {'fused':>9s} {'ratio':>7s} {'naive':>9s} {'ratio':>7s}")
        for T in Ts:
            t = time_all(T, args.causal, repeat, backward)
            print(f"{T:6d} {t['sdpa'] * 1e3:9.1f} {t['fused'] * 1e3:9.1f} {t['fused'] / t['sdpa']:6.2f}x "
                  f"{t['naive'] * 1e3:9.1f} {t['naive'] / t['sdpa']:6.2f}x")
    if args.no_memory:
        return
    Ts = [512, 1024, 2048] if args.quick else [512, 1024, 2048, 4096]
    curve = memory_curve(Ts, causal=args.causal)
    print("\nextra memory, forward (MiB above the inputs: peak resident memory, one process per method)")
    print(f"{'T':>6s} " + " ".join(f"{m:>9s}" for m in curve) + f" {'naive/fused':>12s}")
    for i, T in enumerate(Ts):
        print(f"{T:6d} " + " ".join(f"{curve[m][i] / 2**20:9.2f}" for m in curve) +
              f" {curve['naive'][i] / max(curve['fused'][i], 1):11.0f}x")


if __name__ == "__main__":
    main()
