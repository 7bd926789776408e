"""Chapter 10 profile: where the CPU kernels' time goes, against the goals of benchmarks/ch10_scan.py and ch10_attention.py.

    python benchmarks/ch10_profile.py                 # both kernels, 1 thread then every core
    python benchmarks/ch10_profile.py --threads 2     # one thread count only

Counts, the same on any machine (printed first):
- the exponentials each forward takes, and the bytes it must read and write (its floor of memory traffic);
- the balance of the causal triangle over the threads: the tile work each thread gets
  when Numba's prange hands every thread one contiguous block of the tasks, in the kernels' zigzag order
  and in plain order, for 2 and 16 threads.

Times (contestants in turns, the median of `--rounds` rounds; the figures move with the machine's load,
the ratios much less), each against its peer at the benchmarks' sizes:
- attention forward: the course's kernel, the same kernel with the softmax taken out (its two tile products
  alone, over the same tiles), the previous design (64 x 64 tiles, V transposed whole), and SDPA;
- scan forward: the course's kernel compiled for N = 16, the same kernel reading N at run time, the same
  loop without its exponentials, and chapter 05's loop.
"""

import argparse

import common  # first: idle OpenMP threads sleep instead of spinning on the cores
import numba  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from numba import prange  # noqa: E402

from course_lib.fused import attention_cpu, scan_cpu  # noqa: E402
from course_lib.fused.scan_op import CHUNK  # noqa: E402
from course_lib.mamba.scan import selective_scan_sequential  # noqa: E402
from course_lib.simd.tiles import matmul_bt, transpose  # noqa: E402

B, H, T, d = 1, 4, 2048, 64              # attention: causal, float32
b, L, D, N = 1, 1024, 256, 16            # scan: float32


def tile_work(T, BQ):
    """The work of each query tile of a causal head: its rows times the keys up to its last row's last key
    (the tile products cover whole rows of the visited key tiles)."""
    return [min(BQ, T - i0) * min(T, i0 + BQ) for i0 in range(0, T, BQ)]


def balance(threads, order):
    """The largest thread's share of the work over the mean share, the tasks split in contiguous blocks."""
    work = tile_work(T, attention_cpu.FORWARD_TILES[0])
    n = len(work)
    tasks = [work[attention_cpu.zigzag.py_func(t, n) if order == "zigzag" else t] for t in range(n)] * H
    blocks = np.array_split(np.array(tasks, float), threads)
    return max(x.sum() for x in blocks) / (sum(tasks) / threads)


def counts():
    visible = H * T * (T + 1) // 2
    print(f"attention, causal, B = {B}, H = {H}, T = {T}, d = {d}, float32")
    print(f"  exponentials: {visible / 1e6:.1f}M (one per visible score) plus one per row and key tile; "
          f"tile products: {4 * visible * d / 1e9:.2f} GFLOP")
    print(f"  bytes: q, k, v read {3 * H * T * d * 4 / 1e6:.1f} MB, out and lse written {H * T * (d + 1) * 4 / 1e6:.1f} MB; "
          f"each query tile reads every key tile it sees again (from the caches)")
    for threads in (2, 16):
        print(f"  {threads} threads, the largest share over the mean: zigzag order {balance(threads, 'zigzag'):.2f}, "
              f"plain order {balance(threads, 'plain'):.2f}")
    print(f"scan, b = {b}, L = {L}, D = {D}, N = {N}, float32")
    print(f"  exponentials: {b * L * D * N / 1e6:.1f}M; bytes read {4 * b * L * (2 * D + 2 * N) / 1e6:.2f} MB, written "
          f"{4 * b * L * D / 1e6:.2f} MB (y) and {4 * b * -(-L // CHUNK) * D * N / 1e6:.2f} MB (checkpoints); "
          f"chapter 05's loop writes and reads {4 * 3 * b * L * D * N / 1e6:.0f} MB of (b, L, D, N) tensors")


@numba.njit(parallel=True, cache=True)
def products_only(q, k, v, BQ, BK):
    """The forward's two tile products over the causal tiles, with no softmax between them."""
    BH, Tq, dq = q.shape
    dv = v.shape[2]
    n = (Tq + BQ - 1) // BQ
    total = 0.0
    for task in prange(BH * n):
        h, i0 = task // n, attention_cpu.zigzag(task % n, n) * BQ
        nq = min(BQ, Tq - i0)
        s, vt, acc = np.empty((nq, BK), q.dtype), np.empty((dv, BK), q.dtype), np.zeros((nq, dv), q.dtype)
        for j0 in range(0, i0 + nq, BK):
            nk = min(BK, i0 + nq - j0)
            matmul_bt(q[h, i0:], k[h, j0:], s, nq, nk, dq, False)
            transpose(v[h, j0:], vt, nk, dv)
            matmul_bt(s, vt, acc, nq, dv, nk, True)
        total += acc[0, 0]
    return total


@numba.njit(parallel=True, fastmath=scan_cpu.FASTMATH, cache=True)
def scan_without_exp(x, delta, A, B, C, D, y, chunk):
    """The scan's loop with the decay exp(delta A) replaced by delta A: the cost of everything but the exp."""
    bsz, L, Dm = x.shape
    for i in prange(bsz * Dm):
        N = 16
        b, d = i // Dm, i % Dm
        h = np.zeros(N, x.dtype)
        for t in range(L):
            dt, xt = delta[b, t, d], x[b, t, d]
            u, acc = dt * xt, xt * D[d]
            for n in range(N):
                h[n] = dt * A[d, n] * h[n] + u * B[b, t, n]
                acc += C[b, t, n] * h[n]
            y[b, t, d] = acc


def times(threads, rounds):
    torch.set_num_threads(threads)
    numba.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, d, generator=g) for _ in range(3))
    qn, kn, vn = (t[0].numpy().copy() for t in (q, k, v))
    out, lse = np.empty_like(qn), np.empty((H, T), np.float32)
    scale = np.float32(d ** -0.5)
    tiles = attention_cpu.FORWARD_TILES
    with torch.no_grad():
        ms = common.compare({
            "SDPA": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            "course": lambda: attention_cpu.forward_kernel(qn, kn, vn, out, lse, scale, True, *tiles),
            "products only": lambda: products_only(qn, kn, vn, *tiles),
            "64 x 64 tiles": lambda: attention_cpu.forward_kernel(qn, kn, vn, out, lse, scale, True, 64, 64)},
            rounds=rounds)
    print(f"\n{threads} thread(s), attention forward: " + ", ".join(f"{n} {t:.1f} ms" for n, t in ms.items()))
    print(f"  course / SDPA {ms['course'] / ms['SDPA']:.2f} (goal <= 1.3); the products are "
          f"{ms['products only'] / ms['course']:.0%} of the course's time and alone take "
          f"{ms['products only'] / ms['SDPA']:.2f}x SDPA's; "
          f"{4 * H * T * (T + 1) / 2 * d / ms['products only'] / 1e6:.0f} GFLOP/s in them")
    x, delta, A, Bm, Cm, Dk = (torch.randn(b, L, D, generator=g), F.softplus(torch.randn(b, L, D, generator=g) - 2),
                               -torch.exp(torch.randn(D, N, generator=g) * 0.5), torch.randn(b, L, N, generator=g),
                               torch.randn(b, L, N, generator=g), torch.randn(D, generator=g))
    arrays = [t.numpy() for t in (x, delta, A, Bm, Cm, Dk)]
    y, h_last = np.empty((b, L, D), np.float32), np.empty((b, D, N), np.float32)
    ckpt = np.empty((b, -(-L // CHUNK), D, N), np.float32)
    with torch.no_grad():
        ms = common.compare({
            "chapter 05's loop": lambda: selective_scan_sequential(x, delta, A, Bm, Cm, Dk),
            "course (N = 16 compiled in)": lambda: scan_cpu.forward_kernel(N)(*arrays, y, h_last, ckpt, CHUNK),
            "N read at run time": lambda: scan_cpu.forward_kernel(0)(*arrays, y, h_last, ckpt, CHUNK),
            "no exp": lambda: scan_without_exp(*arrays, y, CHUNK)}, rounds=rounds)
    print(f"{threads} thread(s), scan forward: " + ", ".join(f"{n} {t:.2f} ms" for n, t in ms.items()))
    course, loop = ms["course (N = 16 compiled in)"], ms["chapter 05's loop"]
    print(f"  loop / course {loop / course:.1f}x (goal >= 10); N read at run time "
          f"{ms['N read at run time'] / course:.2f}x the course's time; without the exp {ms['no exp'] / course:.0%} of it")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=None)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    counts()
    for threads in args.threads or sorted({1, numba.config.NUMBA_NUM_THREADS}):
        times(threads, args.rounds)


if __name__ == "__main__":
    main()
