"""Chapter 07 on a real GPU: each step of the matmul ladder against cuBLAS, side by side in one run.

    python benchmarks/ch07_matmul_gpu.py [--sizes 1024 2048 4096] [--repeats 5]

For each n, C = A @ B with n x n float32 matrices already on the device, computed by each step of
the ladder (course_lib/cuda/matmul.py: coalesced, shared-memory tiles, 1D and 2D register blocking)
and by torch.matmul (cuBLAS) in FP32 with TF32 off. Prints each step's GFLOP/s and its share of
cuBLAS's, the largest difference from cuBLAS's result, and each kernel's registers and local memory
as the dispatcher reports them. Each time is the median of --repeats runs after a warm-up (which
compiles), measured with CUDA events. Needs a CUDA GPU; without one it says so and exits (status 0).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from course_lib import device  # noqa: E402


def median_ms(fn, repeats):
    """Median milliseconds of fn() over `repeats` runs after one untimed run, by CUDA events."""
    from numba import cuda

    fn()
    cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = cuda.event(), cuda.event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop))
    return sorted(times)[len(times) // 2]


def tf32_off():
    """cuBLAS in plain FP32, as the course's kernels compute."""
    import torch

    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = "ieee"
    else:
        matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def ladder_rows(sizes, repeats, ladder=None, slow_limit=2048):
    """Yield (n, {step or "cuBLAS": ms}, {step: max |C - cuBLAS's C|}) for each n.

    The coalesced kernel is timed only up to `slow_limit` (it takes a tenth of a second at 4096)."""
    import numpy as np
    import torch
    from numba import cuda

    from course_lib.cuda import matmul as M

    ladder = ladder or M.LADDER
    tf32_off()
    rng = np.random.default_rng(0)
    for n in sizes:
        A = rng.uniform(-1, 1, (n, n)).astype(np.float32)
        B = rng.uniform(-1, 1, (n, n)).astype(np.float32)
        tA, tB = torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda()
        dA, dB = cuda.as_cuda_array(tA), cuda.as_cuda_array(tB)
        ref = tA @ tB
        times, errors = {"cuBLAS": median_ms(lambda: torch.matmul(tA, tB), repeats)}, {}
        for step, (kernel, block, tile) in ladder.items():
            if step == "coalesced" and n > slow_limit:
                continue
            tC = torch.empty((n, n), device="cuda")
            dC = cuda.as_cuda_array(tC)
            grid = M.grid_for((n, n), tile)
            times[step] = median_ms(lambda: kernel[grid, block](dA, dB, dC), repeats)
            errors[step] = float((tC - ref).abs().max())
        yield n, times, errors


def registers(ladder=None):
    """{step: (registers per thread, bytes of local memory per thread)} from the dispatcher, after a launch."""
    from course_lib.cuda import matmul as M

    out = {}
    for step, (kernel, _, _) in (ladder or M.LADDER).items():
        for sig in kernel.overloads:
            out[step] = (kernel.get_regs_per_thread(sig), kernel.get_local_mem_per_thread(sig))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    if not device.gpu_present():
        print("No CUDA GPU on this machine: nothing to measure. Run this script on a machine with an "
              "NVIDIA GPU (the simulator's timings say nothing about GPU speed).")
        return 0
    device.setup(verbose=False)
    import torch

    from course_lib.cuda import matmul as M
    from course_lib.cuda.launch import device_name

    if not torch.cuda.is_available():
        print("This torch build has no CUDA: there is no cuBLAS to compare with.")
        return 0
    steps = list(M.LADDER)
    print(f"device: {device_name()}; float32; cuBLAS with TF32 off; median of {args.repeats} runs after a warm-up")
    print(f"{'n':>6} " + " ".join(f"{s + ' GFLOP/s':>22}" for s in steps + ["cuBLAS"]))
    shares = {}
    for n, times, errors in ladder_rows(args.sizes, args.repeats):
        flops = 2.0 * n ** 3
        rate = {s: flops / ms / 1e6 for s, ms in times.items()}
        cells = [f"{rate[s]:9.0f} ({rate[s] / rate['cuBLAS']:5.1%})" if s in rate else f"{'-':>17}" for s in steps]
        print(f"{n:6d} " + " ".join(f"{c:>22}" for c in cells) + f" {rate['cuBLAS']:22.0f}")
        print(f"{'':6} largest |C - cuBLAS's C|: " + ", ".join(f"{s} {e:.1e}" for s, e in errors.items()))
        shares[n] = rate["2D blocking"] / rate["cuBLAS"]
    print("registers and local memory per thread (the dispatcher's report): "
          + "; ".join(f"{s}: {r} registers, {b} B local" for s, (r, b) in registers().items()))
    if 4096 in shares:
        verdict = "meets" if shares[4096] >= 0.5 else "misses"
        print(f"2D blocking at n = 4096: {shares[4096]:.1%} of cuBLAS's GFLOP/s, which {verdict} the goal of 50%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
