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
- attention forward: the course's kernel, its two tile products alone over the same tiles, the solved
  notebook's flash_forward (the layout before: scores a query per row, products through matmul_bt, V
  transposed per tile), and SDPA; then one 64 x 256 x 64 tile product on one thread, in GFLOP/s: the
  course's `matmul` (vectorized along a row of the output) and `matmul_bt` (dot products whose lanes are
  summed at the end);
- scan forward: chapter 05's loop, the course's op (what the benchmark times), its kernel (a task runs up
  to 128 channels side by side), the solved notebook's fused_scan (a channel per task, its N states
  innermost, the layout before), the per-channel loop without its exponentials, and the exponentials
  alone (the floor of any kernel that takes them with this exp): the best ratio to the loop that a
  kernel built on it could reach.
Write the figures up as loaded unless `uptime` showed an idle machine (see benchmarks/ch10_cpu_profile.md).
"""

import argparse

import common  # first: idle OpenMP threads sleep instead of spinning on the cores
import numba  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from numba import prange  # noqa: E402

from course_lib.fused import attention_cpu, scan_cpu  # noqa: E402
from course_lib.fused.scan_op import CHUNK, selective_scan_fused  # noqa: E402
from course_lib.mamba.scan import selective_scan_sequential  # noqa: E402
from course_lib.simd.fastexp import exp_neg  # noqa: E402
from course_lib.simd.tiles import matmul, matmul_bt  # noqa: E402

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
    print(f"  exponentials: one per (step, channel, state), {N} per step of a channel; the course's kernel takes a state "
          f"of 16 channels per AVX-512 vector (8 with AVX2), the channel-per-task layout {N} states of one channel; a "
          f"step reads B_t and C_t ({2 * N * 4} bytes, shared by every channel, from the cache), and x, delta and y")
    print(f"  exponentials: {b * L * D * N / 1e6:.1f}M; bytes read {4 * b * L * (2 * D + 2 * N) / 1e6:.2f} MB, written "
          f"{4 * b * L * D / 1e6:.2f} MB (y) and {4 * b * -(-L // CHUNK) * D * N / 1e6:.2f} MB (checkpoints, "
          f"when a backward will follow); "
          f"chapter 05's loop writes and reads {4 * 3 * b * L * D * N / 1e6:.0f} MB of (b, L, D, N) tensors")


@numba.njit(parallel=True, cache=True)
def products_only(q, k, v, BQ, BK):
    """The forward's two tile products over the causal tiles, laid out as the course's forward lays them out
    (scores transposed, a key per row), with no softmax between them."""
    BH, Tq, dq = q.shape
    dv = v.shape[2]
    n = (Tq + BQ - 1) // BQ
    total = 0.0
    for task in prange(BH * n):
        h, i0 = task // n, attention_cpu.zigzag(task % n, n) * BQ
        nq = min(BQ, Tq - i0)
        qt, st, acc = np.ascontiguousarray(q[h, i0:i0 + nq].T), np.empty((BK, nq), q.dtype), np.zeros((nq, dv), q.dtype)
        for j0 in range(0, i0 + nq, BK):
            nk = min(BK, i0 + nq - j0)
            matmul(k[h, j0:], qt, st, nk, nq, dq, False)
            matmul(st, v[h, j0:], acc, nq, dv, nk, True, True)
        total += acc[0, 0]
    return total


@numba.njit(parallel=True, fastmath=scan_cpu.FASTMATH, cache=True)
def exps_only(delta, A, out):
    """The scan's L * D * N exponentials alone, split over the threads as the kernel splits them. N is read at
    run time: with N = 16 written in, LLVM unrolls this short loop and leaves the exps scalar (check with
    exps_only.inspect_asm(): vrndscaleps or vroundps is the vector floor of exp_neg)."""
    bsz, L, Dm = delta.shape
    N = A.shape[1]
    for i in prange(bsz * Dm):
        b, d = i // Dm, i % Dm
        s = np.zeros(N, delta.dtype)
        for t in range(L):
            dt = delta[b, t, d]
            for n in range(N):
                s[n] += exp_neg(dt * A[d, n])
        out[b, d] = s.sum()


@numba.njit(parallel=True, fastmath=scan_cpu.FASTMATH, cache=True)
def scan_without_exp(x, delta, A, B, C, D, y, chunk):
    """The per-channel loop (a channel per task, N states innermost) with the decay exp(delta A) replaced by
    delta A: the cost of everything in that layout but the exp."""
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


def tile_products():
    """GFLOP/s of one 64 x 256 x 64 float32 tile product on this thread, in the two layouts. (numpy's BLAS is left
    out: it would run on a thread pool of its own.)"""
    g = np.random.default_rng(0)
    a, b = g.standard_normal((64, 64)).astype(np.float32), g.standard_normal((256, 64)).astype(np.float32)
    out = np.empty((256, 64), np.float32)
    ms = common.compare({"matmul (course's forward)": lambda: matmul(b, a, out, 256, 64, 64, False),
                         "matmul_bt (dot products)": lambda: matmul_bt(b, a, out, 256, 64, 64, False)}, rounds=9)
    flop = 2 * 64 * 256 * 64
    return {n: flop / t / 1e6 for n, t in ms.items()}


def times(threads, rounds):
    torch.set_num_threads(threads)
    numba.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, d, generator=g) for _ in range(3))
    qn, kn, vn = (t[0].numpy().copy() for t in (q, k, v))
    out, lse = np.empty_like(qn), np.empty((H, T), np.float32)
    scale = np.float32(d ** -0.5)
    tiles = attention_cpu.FORWARD_TILES
    from ch10_solutions import solution_kernels

    solved = solution_kernels()
    before = solved["flash_forward"]
    with torch.no_grad():
        ms = common.compare({
            "SDPA": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            "course": lambda: attention_cpu.forward_kernel(qn, kn, vn, out, lse, scale, True, *tiles),
            "products only": lambda: products_only(qn, kn, vn, *tiles),
            "a query per row": lambda: before(qn, kn, vn, out, lse, scale, True, *tiles)},
            rounds=rounds)
    flop = 4 * H * T * (T + 1) / 2 * d
    print(f"\n{threads} thread(s), attention forward: " + ", ".join(f"{n} {t:.1f} ms" for n, t in ms.items()))
    print(f"  course / SDPA {ms['course'] / ms['SDPA']:.2f} (goal <= 1.3); a query per row / SDPA "
          f"{ms['a query per row'] / ms['SDPA']:.2f} (the solved notebook's flash_forward); the products are "
          f"{ms['products only'] / ms['course']:.0%} of the course's time and alone take {ms['products only'] / ms['SDPA']:.2f}x "
          f"SDPA's; {flop / ms['products only'] / 1e6:.0f} GFLOP/s in them, SDPA {flop / ms['SDPA'] / 1e6:.0f} GFLOP/s "
          f"counting only its products")
    if threads == 1:
        rates = tile_products()
        print("  one 64 x 256 x 64 tile product, one thread: " + ", ".join(f"{n} {r:.0f} GFLOP/s" for n, r in rates.items()))
    x, delta, A, Bm, Cm, Dk = (torch.randn(b, L, D, generator=g), F.softplus(torch.randn(b, L, D, generator=g) - 2),
                               -torch.exp(torch.randn(D, N, generator=g) * 0.5), torch.randn(b, L, N, generator=g),
                               torch.randn(b, L, N, generator=g), torch.randn(D, generator=g))
    arrays = [t.numpy() for t in (x, delta, A, Bm, Cm, Dk)]
    y, h_last = np.empty((b, L, D), np.float32), np.empty((b, D, N), np.float32)
    ckpt = np.empty((b, -(-L // CHUNK), D, N), np.float32)
    sums = np.empty((b, D), np.float32)
    per_channel = solved["fused_scan"]
    with torch.no_grad():
        ms = common.compare({
            "chapter 05's loop": lambda: selective_scan_sequential(x, delta, A, Bm, Cm, Dk),
            "the op": lambda: selective_scan_fused(x, delta, A, Bm, Cm, Dk),
            "course": lambda: scan_cpu.scan_forward(*arrays, y, h_last, ckpt, CHUNK),
            "a channel per task": lambda: per_channel(*arrays, y, h_last, ckpt, CHUNK),
            "no exp": lambda: scan_without_exp(*arrays, y, CHUNK),
            "the exps alone": lambda: exps_only(arrays[1], arrays[2], sums)}, rounds=rounds)
    print(f"{threads} thread(s), scan forward: " + ", ".join(f"{n} {t:.2f} ms" for n, t in ms.items()))
    course, loop, op = ms["course"], ms["chapter 05's loop"], ms["the op"]
    print(f"  loop / op {loop / op:.1f}x (goal >= 10), loop / kernel {loop / course:.1f}x; the op adds "
          f"{(op - course) * 1e3:.0f} us to its kernel; a channel per task {ms['a channel per task'] / course:.2f}x the "
          f"kernel's time, and without the exp {ms['no exp'] / ms['a channel per task']:.0%} of that; "
          f"the exps alone {ms['the exps alone'] / course:.0%} of the course's kernel "
          f"({b * L * D * N / ms['the exps alone'] / 1e6:.1f} G exp/s), so loop / (the exps alone) = "
          f"{loop / ms['the exps alone']:.1f}x bounds what a kernel with this exp can reach; the loop takes "
          f"{loop / L * 1e3:.1f} us a step")


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
