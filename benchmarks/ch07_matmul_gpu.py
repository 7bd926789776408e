"""Chapter 07 on a real GPU: GFLOP/s of the naive and the tiled matmul kernels against cuBLAS.

    python benchmarks/ch07_matmul_gpu.py [--sizes 1024 2048 4096] [--repeats 5]

For each n, C = A @ B with n x n float32 matrices already on the device. The peer is
torch.matmul (cuBLAS) in FP32 with TF32 off, timed side by side in the same run. Each
figure is the median of --repeats timed runs after one warm-up, measured with CUDA events.
Needs a CUDA GPU; on a machine without one it says so and exits (status 0).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from course_lib import device  # noqa: E402


def median_ms(fn, repeats):
    from numba import cuda

    fn()                                            # warm-up (and compilation)
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

    import numpy as np
    import torch
    from numba import cuda

    from course_lib.cuda.launch import check_config, device_name
    from course_lib.cuda.matmul import TILE, grid_for, k_matmul_naive, k_matmul_tiled

    have_torch = torch.cuda.is_available()
    if have_torch:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    print(f"device: {device_name()}; float32; TF32 off; median of {args.repeats} runs; tile {TILE}x{TILE}")
    if not have_torch:
        print("(this torch build has no CUDA: the cuBLAS column is left empty)")
    print(f"{'n':>6} {'naive GFLOP/s':>14} {'tiled GFLOP/s':>14} {'cuBLAS GFLOP/s':>15} "
          f"{'naive/cuBLAS':>13} {'tiled/cuBLAS':>13} {'max |err|':>10}")
    rng = np.random.default_rng(0)
    for n in args.sizes:
        A = rng.uniform(-1, 1, (n, n)).astype(np.float32)
        B = rng.uniform(-1, 1, (n, n)).astype(np.float32)
        dA, dB, dC = cuda.to_device(A), cuda.to_device(B), cuda.device_array((n, n), np.float32)
        flops = 2.0 * n ** 3
        rates = {}
        for name, kernel, block in [("naive", k_matmul_naive, (16, 16)), ("tiled", k_matmul_tiled, (TILE, TILE))]:
            grid, block = check_config(grid_for((n, n), block), block)
            ms = median_ms(lambda: kernel[grid, block](dA, dB, dC), args.repeats)
            rates[name] = flops / ms / 1e6
        C = dC.copy_to_host()
        err = float("nan")
        if have_torch:
            tA, tB = torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda()
            ms = median_ms(lambda: torch.matmul(tA, tB), args.repeats)
            rates["cublas"] = flops / ms / 1e6
            err = float((torch.from_numpy(C).cuda() - tA @ tB).abs().max())
        cub = rates.get("cublas")
        ratio = (lambda r: f"{r / cub:13.3f}") if cub else (lambda r: f"{'-':>13}")
        print(f"{n:6d} {rates['naive']:14.1f} {rates['tiled']:14.1f} {cub if cub else float('nan'):15.1f} "
              f"{ratio(rates['naive'])} {ratio(rates['tiled'])} {err:10.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
