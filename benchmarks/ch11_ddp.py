"""Chapter 11 on gloo CPU processes: the ring against gloo's all-reduce, DDP against torch's, ZeRO's memory.

1. ring_all_reduce (send/recv) and dist.all_reduce side by side on float32 tensors from 1 KiB to 16 MiB,
   with the cost model 2(p-1)·latency + 2(p-1)/p·n / bandwidth fitted to the ring's times.
2. A training step of chapter 04's GPT (nanoGPT's CPU shape: 4 layers, 4 heads, 128 wide, block 64) under
   our DDP at several bucket sizes and under torch.nn.parallel.DistributedDataParallel, steps interleaved.
3. Optimizer state per rank: ZeroOptimizer around AdamW at world sizes 1 to 4 against torch.optim.AdamW
   (float32 GPT).

    python benchmarks/ch11_ddp.py [--world 2] [--repeats 20] [--steps 12] [--yours]

--yours times your saved ring, DDP and ZeroOptimizer (work/yours/ch11.py, each checked again first) in
place of the course's. Each rank runs one thread; on a machine with fewer cores than ranks, the figures
mostly measure sharing, and a machine busy with other work slows the contestants unevenly: the rounds
are interleaved and the medians reported, but re-run on an idle machine before trusting a ratio.
"""

import argparse

import torch.distributed as dist

from course_lib.distributed import carry, launch, timing
from course_lib.distributed.collectives import ring_all_reduce
from course_lib.distributed.cost import fit, ring_bytes, ring_seconds
from course_lib.distributed.ddp import DDP
from course_lib.distributed.launch import run_all
from course_lib.distributed.zero import ZeroOptimizer


def ring_table(world, repeats, ring):
    lengths = [2**k for k in range(8, 23, 2)]   # float32: 1 KiB ... 16 MiB
    fns = {"ring": ring, "gloo": dist.all_reduce}
    rows = launch(timing.time_collectives, world, fns, lengths, repeats, timeout=300)[0]
    latency, bandwidth = fit([2 * (world - 1)] * len(rows), [ring_bytes(r["bytes"], world) for r in rows],
                             [r["ring"] for r in rows])
    print(f"\n1. all-reduce on {world} gloo processes (float32; median of {repeats}, the two taking turns)")
    if bandwidth is None:
        print(f"   cost model fitted to the ring: latency {latency * 1e6:.0f} us per message; the times did not grow "
              "with size, so no bandwidth could be fitted (a busy machine?)")
        bandwidth = float("inf")
    else:
        print(f"   cost model 2(p-1)·latency + 2(p-1)/p·n/bandwidth, least squares over all sizes: latency "
              f"{latency * 1e6:.0f} us per message, bandwidth {bandwidth / 1e9:.2f} GB/s")
    print(f"{'bytes':>11} {'sent/rank':>11} {'ring ms':>9} {'model ms':>9} {'gloo ms':>9} {'ring/gloo':>10}")
    for r in rows:
        model = ring_seconds(r["bytes"], world, latency, bandwidth)
        print(f"{r['bytes']:>11} {ring_bytes(r['bytes'], world):>11.0f} {r['ring'] * 1e3:>9.3f} {model * 1e3:>9.3f} "
              f"{r['gloo'] * 1e3:>9.3f} {r['ring'] / r['gloo']:>10.2f}")


def ddp_table(world, steps, ddp_class):
    sizes = [0, 2**16, 2**20, 25 * 2**20]
    job = (timing.ddp_step_times, dict(ddp_class=ddp_class, bucket_sizes=sizes, steps=steps))
    times = launch(run_all, world, [job], timeout=300)[0][0]
    theirs = times["torch DDP"]
    print(f"\n2. GPT training step on {world} processes (4 layers, 128 wide, batch 8 x 64; median of {steps - 2})")
    print("   bucket 0 B: one all-reduce per parameter; 25 MiB: one bucket for the whole model (about 3 MB)")
    print(f"{'bucket':>16} {'ms/step':>9} {'vs torch DDP':>13}")
    for name, t in times.items():
        name = name if isinstance(name, str) else f"ours, {_size(name)}"
        print(f"{name:>16} {t * 1e3:>9.1f} {t / theirs:>13.2f}")


def _size(n):
    return f"{n >> 20} MiB" if n >= 2**20 else f"{n >> 10} KiB" if n >= 2**10 else f"{n} B"


def zero_table(max_world, zero_class):
    print("\n3. optimizer state per rank, float32 GPT (4 layers, 128 wide)")
    print(f"{'world':>6} {'ZeRO-1 bytes':>16} {'AdamW bytes':>12} {'ratio':>7} {'1/p':>6}")
    for p in range(1, max_world + 1):
        ours, full = launch(run_all, p, [(timing.optimizer_state_bytes, dict(zero_class=zero_class))], timeout=300)[0][0]
        print(f"{p:>6} {ours:>16} {full:>12} {ours / full:>7.3f} {1 / p:>6.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--yours", action="store_true", help="time your saved pieces instead of the course's")
    args = parser.parse_args()
    pieces = {"ring_all_reduce": ring_all_reduce, "DDP": DDP, "ZeroOptimizer": ZeroOptimizer}
    if args.yours:
        from course_lib.yours import distributed

        pieces = distributed.assemble().pieces
    ring, ddp, zero = (carry(pieces[name]) for name in ("ring_all_reduce", "DDP", "ZeroOptimizer"))
    ring_table(args.world, args.repeats, ring)
    ddp_table(args.world, args.steps, ddp)
    zero_table(4, zero)


if __name__ == "__main__":
    main()
