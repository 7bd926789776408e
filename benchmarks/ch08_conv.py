"""Conv2d forward: our im2col and Numba variants against F.conv2d, side by side in one run.

    .venv/bin/python benchmarks/ch08_conv.py [--threads N]

Prints, for a digits-sized batch and a 32x32x64-channel one, the best-of-N time of each variant
and its ratio to F.conv2d (float32, CPU; a CUDA line too when a GPU is present). Forward only,
under no_grad. Torch and Numba use the same thread count, so neither pool steals the other's cores.

CPU times are the process's CPU time (time.process_time), so a machine shared with other work
does not inflate them; with more than one thread they add up the work of all threads. The CUDA
line uses wall time after a synchronize.
"""

import argparse
import functools
import time

import common  # first: idle OpenMP threads wait passively, so their spinning is not counted as CPU time
import numba
import torch
import torch.nn.functional as F

from course_lib.custom_ops import conv
from course_lib.custom_ops import functions as fn

best_of = functools.partial(common.best_of, clock=time.process_time)

CASES = {
    "digits   x(64,1,8,8)    w(16,1,3,3)": ((64, 1, 8, 8), (16, 1, 3, 3)),
    "digits   x(64,16,4,4)   w(32,16,3,3)": ((64, 16, 4, 4), (32, 16, 3, 3)),
    "32x32x64 x(8,64,32,32)  w(64,64,3,3)": ((8, 64, 32, 32), (64, 64, 3, 3)),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    torch.manual_seed(0)
    print(f"threads: {args.threads}; best of {args.repeat}; CPU ms per call; ratio = variant / F.conv2d")
    print(f"{'case':40s} {'F.conv2d':>9s} {'im2col':>9s} {'ratio':>7s} {'numba':>9s} {'ratio':>7s}")
    with torch.no_grad():
        for name, (xs, ws) in CASES.items():
            x, w, b = torch.randn(xs), torch.randn(ws), torch.randn(ws[0])
            t_ref = best_of(lambda: F.conv2d(x, w, b, 1, 1), args.repeat)
            t_col = best_of(lambda: conv.conv2d_im2col(x, w, b, 1, 1), args.repeat)
            t_nb = best_of(lambda: fn.conv2d_numba(x, w, b, 1, 1), args.repeat)
            print(f"{name:40s} {t_ref * 1e3:9.3f} {t_col * 1e3:9.3f} {t_col / t_ref:6.1f}x "
                  f"{t_nb * 1e3:9.3f} {t_nb / t_ref:6.1f}x")
            if torch.cuda.is_available():
                xg, wg, bg = x.cuda(), w.cuda(), b.cuda()
                sync = torch.cuda.synchronize
                t_ref_g = best_of(lambda: (F.conv2d(xg, wg, bg, 1, 1), sync()), args.repeat, time.perf_counter)
                t_col_g = best_of(lambda: (conv.conv2d_im2col(xg, wg, bg, 1, 1), sync()), args.repeat, time.perf_counter)
                print(f"{'  cuda':40s} {t_ref_g * 1e3:9.3f} {t_col_g * 1e3:9.3f} {t_col_g / t_ref_g:6.1f}x")


if __name__ == "__main__":
    main()
