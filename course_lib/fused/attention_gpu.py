"""Attention at GPU speed: the kernels the chapter's op runs on CUDA tensors.

attention_cuda.py teaches the algorithm with one thread per query row. This file runs the same
algorithm (tiles of keys, an online softmax) laid out the way a GPU wants it. Where each number lives:

- **Compile time.** The head sizes D (q, k) and DV (v) and the dtype are constants of the kernel:
  `forward_kernel(dtype, D, DV)` compiles one kernel per triple (functools.cache). Every loop over
  them has a known length, so the compiler unrolls it and each thread's small arrays become registers.
- **A block** of 128 threads owns BQ = 64 query rows of one head and walks the keys BK = 64 at a time
  (32 x 32 tiles in float64, whose shared arrays would not fit otherwise).
- **Shared memory** (48 KiB in float32): q's tile, transposed and pre-scaled by scale * log2(e) so that
  every exponential is an `exp2`; one key tile, transposed, whose buffer then holds P (the tile's
  probabilities, transposed) once the scores are made; one value tile.
- **Registers.** The 64 x 64 tile of scores is cut into 4 x 8 blocks, one per thread: thread t takes
  rows 4 * (t // 8) .. + 3 and columns t % 8, t % 8 + 8, ... (so neighbouring lanes read neighbouring
  words of shared memory). Each step of QKᵀ loads 4 numbers of q and 8 of k and makes 32 products:
  that register blocking is what chapter 07's 2D-blocked matmul did. PV is blocked the same way:
  the thread's 4 rows times its 8 output columns. Its running max m, sum l and accumulators stay in
  registers for the whole walk; everything is accumulated in fp32 (or fp64 for float64 inputs).
- **Warps.** The 8 threads that share a row are 8 lanes of one warp, so a row's max is three
  `cuda.shfl_xor_sync` steps (lanes 1, 2, 4 apart), with no shared memory and no barrier. The row's
  sum needs no exchange until the end: each lane keeps its share of l, rescaled by the same factor.
- **The causal mask** costs only where it cuts: a tile wholly below the diagonal takes the unmasked
  path, and tiles wholly above it are never loaded. Blocks are launched last tile first, so the
  longest ones (the bottom rows see the most keys) start first.

The backward (at the end of the file) is built the same way: head sizes compiled in, exp2, tiles of
the other side in shared memory, and warp shuffles for its dot products.

On Numba's simulator (no GPU) the same kernels run with each thread as a Python thread and the warp
shuffles from warps.py; keep the sizes tiny there.
"""

import functools
import math

from course_lib import device

device.setup(verbose=False)

import numba  # noqa: E402
import torch  # noqa: E402
from numba import cuda  # noqa: E402  (after the device is chosen)

from course_lib.custom_ops.numba_cuda import kernel_view  # noqa: E402
from course_lib.fused import warps  # noqa: E402

warps.teach_simulator()

THREADS = 128                  # threads per block
LANES = 8                      # the lanes that share a row of the score tile
ROW_GROUPS = THREADS // LANES  # 16
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
D_MAX = 64                     # the largest head size (q, k and v)
ALL = 0xFFFFFFFF               # every lane of the warp takes part in a shuffle


def tiles(dtype):
    """(BQ, BK): query rows per block, keys per tile."""
    return (64, 64) if dtype == numba.float32 else (32, 32)


@functools.cache
def forward_kernel(dtype, D, DV):
    """The forward kernel for one numba dtype and head sizes D (q, k) and DV (v), compiled on first use."""
    BQ, BK = tiles(dtype)
    RM, RN = BQ // ROW_GROUPS, BK // LANES       # each thread's block of scores: RM rows, RN columns
    E = -(-DV // LANES)                          # each thread's output columns
    DVP, NB = E * LANES, max(RN, E)              # v's tile padded to whole lanes; the loads' buffer
    KP = max(D * BK, BK * BQ)                    # the buffer of K's tile, then of P's
    inf = math.inf

    @cuda.jit
    def kernel(q, k, v, out, lse, qscale, causal):
        h, tile, t = cuda.blockIdx.y, cuda.gridDim.x - 1 - cuda.blockIdx.x, cuda.threadIdx.x
        r, c = t // LANES, t % LANES             # rows r*RM .. r*RM+RM-1, columns c, c+LANES, ...
        Tq, Tk = q.shape[1], k.shape[1]
        i0, offset = tile * BQ, Tk - Tq
        qt = cuda.shared.array((D, BQ), dtype)   # q's tile, transposed, times scale * log2(e)
        kp = cuda.shared.array(KP, dtype)        # K's tile transposed (kk * BK + j), then P's (j * BQ + row)
        vs = cuda.shared.array((BK, DVP), dtype)
        s = cuda.local.array((RM, RN), dtype)    # this thread's scores, then probabilities
        acc = cuda.local.array((RM, E), dtype)
        m = cuda.local.array(RM, dtype)          # running max (in log2 units)
        l = cuda.local.array(RM, dtype)          # this lane's share of the running sum
        a = cuda.local.array(RM, dtype)
        b = cuda.local.array(NB, dtype)

        for idx in range(t, D * BQ, THREADS):
            kk, row = idx // BQ, idx % BQ
            qt[kk, row] = q[h, i0 + row, kk] * qscale if i0 + row < Tq else 0
        for ii in range(RM):
            m[ii], l[ii] = -inf, 0
            for e in range(E):
                acc[ii, e] = 0
        last = min(Tk, i0 + BQ + offset) if causal else Tk       # no row of the block sees a key past it
        edge = min(Tk, i0 + offset + 1) if causal else Tk        # every row of the block sees the keys before it
        for j0 in range(0, last, BK):
            for idx in range(t, D * BK, THREADS):
                kk, j = idx // BK, idx % BK
                kp[kk * BK + j] = k[h, j0 + j, kk] if j0 + j < Tk else 0
            for idx in range(t, BK * DVP, THREADS):
                j, col = idx // DVP, idx % DVP
                vs[j, col] = v[h, j0 + j, col] if j0 + j < Tk and col < DV else 0
            cuda.syncthreads()

            for ii in range(RM):                                  # S = Q Kᵀ, a 4 x 8 block per thread
                for jj in range(RN):
                    s[ii, jj] = 0
            for kk in range(D):
                for ii in range(RM):
                    a[ii] = qt[kk, r * RM + ii]
                for jj in range(RN):
                    b[jj] = kp[kk * BK + c + LANES * jj]
                for ii in range(RM):
                    for jj in range(RN):
                        s[ii, jj] += a[ii] * b[jj]

            masked = j0 + BK > edge                               # a diagonal tile, or the last one
            for ii in range(RM):                                  # the online softmax, row by row
                i = i0 + r * RM + ii
                mx = m[ii]
                for jj in range(RN):
                    if masked:
                        j = j0 + c + LANES * jj
                        if j >= Tk or (causal and j > i + offset):
                            s[ii, jj] = -inf
                    mx = max(mx, s[ii, jj])
                mx = max(mx, cuda.shfl_xor_sync(ALL, mx, 1))      # the row's max over its 8 lanes
                mx = max(mx, cuda.shfl_xor_sync(ALL, mx, 2))
                mx = max(mx, cuda.shfl_xor_sync(ALL, mx, 4))
                alpha = math.exp2(m[ii] - mx)                     # re-base on the new max
                m[ii] = mx
                l[ii] *= alpha
                for e in range(E):
                    acc[ii, e] *= alpha
                for jj in range(RN):
                    p = math.exp2(s[ii, jj] - mx)
                    l[ii] += p
                    s[ii, jj] = p
            cuda.syncthreads()                                    # every thread is done with K's tile
            for ii in range(RM):
                for jj in range(RN):
                    kp[(c + LANES * jj) * BQ + r * RM + ii] = s[ii, jj]
            cuda.syncthreads()

            for j in range(BK):                                   # O += P V, a 4 x E block per thread
                for e in range(E):
                    b[e] = vs[j, c + LANES * e]                   # key j's values, this lane's columns
                for ii in range(RM):
                    p = kp[j * BQ + r * RM + ii]                  # row ii's weight of key j
                    for e in range(E):
                        acc[ii, e] += p * b[e]
            cuda.syncthreads()                                    # before the next tile overwrites them

        for ii in range(RM):
            total = l[ii]
            total += cuda.shfl_xor_sync(ALL, total, 1)            # the row's sum over its 8 lanes
            total += cuda.shfl_xor_sync(ALL, total, 2)
            total += cuda.shfl_xor_sync(ALL, total, 4)
            i = i0 + r * RM + ii
            if i < Tq:
                for e in range(E):
                    col = c + LANES * e
                    if col < DV:
                        out[h, i, col] = acc[ii, e] / total
                if c == 0:
                    lse[h, i] = (m[ii] + math.log2(total)) * LN2

    return kernel


def _numba_dtype(t):
    return {torch.float32: numba.float32, torch.float64: numba.float64}[t.dtype]


def forward(q, k, v, causal=False, scale=None):
    """(out, lse) for tensors q (B, H, Tq, d), k (B, H, Tk, d), v (B, H, Tk, dv), d and dv at most D_MAX."""
    assert not causal or q.shape[2] <= k.shape[2], "causal attention needs Tq <= Tk (each query sees key 0)"
    d, dv = q.shape[-1], v.shape[-1]
    if d > D_MAX or dv > D_MAX:
        raise ValueError(f"head size up to {D_MAX}, got d = {d}, dv = {dv}")
    dtype = _numba_dtype(q)
    qscale = dtype((d ** -0.5 if scale is None else scale) * LOG2E)
    out = q.new_empty(*q.shape[:3], dv)
    lse = q.new_empty(q.shape[:3])
    BQ, _ = tiles(dtype)
    grid = (-(-q.shape[2] // BQ), q.shape[0] * q.shape[1])
    if grid[0] == 0 or grid[1] == 0:
        return out, lse
    views = [kernel_view(a.flatten(0, 1).contiguous()) for a in (q, k, v, out, lse)]
    kernel = forward_kernel(dtype, d, dv)
    if q.is_cuda:
        stream = cuda.external_stream(torch.cuda.current_stream(q.device).cuda_stream)
        kernel[grid, THREADS, stream](*views, qscale, causal)
    else:
        with warps.fast_switching():
            kernel[grid, THREADS](*views, qscale, causal)
    return out, lse


# ---- the backward ------------------------------------------------------------------------------------
#
# P is recomputed from the forward's lse instead of stored: p = exp2(q.k * scale * log2(e) - lse * log2(e)).
# Two kernels, so that each gradient row has one owner and no atomics are needed: dK and dV sum over the
# queries, dQ over the keys. Here a row of the walk is shared by 8 lanes of a warp, each holding every
# 8th number of its row (k and v, or q and dO) in registers; a dot product is 8 lanes' partial sums
# added by three shuffles. The other side's rows come a tile at a time through shared memory.

ROWS = THREADS // LANES        # rows a block owns in the backward: 16


@functools.cache
def backward_kernels(dtype, D, DV):
    """(dK/dV kernel, dQ kernel) for one numba dtype and head sizes D (q, k) and DV (v)."""
    BT, _ = tiles(dtype)                         # rows of the other side staged at a time
    ED, EV = -(-D // LANES), -(-DV // LANES)     # each lane's share of a row of q or k, and of v or dO
    DP, DVP = ED * LANES, EV * LANES

    @cuda.jit
    def dkdv_kernel(q, k, v, do, lse, delta, dk, dv, kscale, scale, causal):
        h, j0, t = cuda.blockIdx.y, cuda.blockIdx.x * ROWS, cuda.threadIdx.x
        r, c = t // LANES, t % LANES             # key j0 + r; this lane holds columns c, c + LANES, ...
        Tq, Tk = q.shape[1], k.shape[1]
        j, offset = j0 + r, Tk - Tq
        qs = cuda.shared.array((BT, DP), dtype)
        dos = cuda.shared.array((BT, DVP), dtype)
        lse2 = cuda.shared.array(BT, dtype)
        dl = cuda.shared.array(BT, dtype)
        kr = cuda.local.array(ED, dtype)         # k * scale * log2(e), this lane's share
        dkr = cuda.local.array(ED, dtype)
        vr = cuda.local.array(EV, dtype)
        dvr = cuda.local.array(EV, dtype)
        for e in range(ED):
            col = c + LANES * e
            kr[e] = k[h, j, col] * kscale if j < Tk and col < D else 0
            dkr[e] = 0
        for e in range(EV):
            col = c + LANES * e
            vr[e] = v[h, j, col] if j < Tk and col < DV else 0
            dvr[e] = 0
        first = max(0, j0 - offset) // BT * BT if causal else 0    # earlier queries see none of these keys
        for i0 in range(first, Tq, BT):
            for idx in range(t, BT * DP, THREADS):
                i, col = idx // DP, idx % DP
                qs[i, col] = q[h, i0 + i, col] if i0 + i < Tq and col < D else 0
            for idx in range(t, BT * DVP, THREADS):
                i, col = idx // DVP, idx % DVP
                dos[i, col] = do[h, i0 + i, col] if i0 + i < Tq and col < DV else 0
            for i in range(t, BT, THREADS):
                lse2[i] = lse[h, i0 + i] * LOG2E if i0 + i < Tq else 0
                dl[i] = delta[h, i0 + i] if i0 + i < Tq else 0
            cuda.syncthreads()
            for i in range(min(BT, Tq - i0)):                        # the same count for the whole block
                s = dtype(0)
                for e in range(ED):
                    s += qs[i, c + LANES * e] * kr[e]
                dp = dtype(0)
                for e in range(EV):
                    dp += dos[i, c + LANES * e] * vr[e]
                for step in (1, 2, 4):                               # the 8 lanes' partial sums
                    s += cuda.shfl_xor_sync(ALL, s, step)
                    dp += cuda.shfl_xor_sync(ALL, dp, step)
                seen = i0 + i < Tq and j < Tk and not (causal and j > i0 + i + offset)
                p = math.exp2(s - lse2[i]) if seen else dtype(0)
                ds = p * (dp - dl[i])
                for e in range(EV):
                    dvr[e] += p * dos[i, c + LANES * e]
                for e in range(ED):
                    dkr[e] += ds * qs[i, c + LANES * e]
            cuda.syncthreads()
        if j < Tk:
            for e in range(ED):
                if c + LANES * e < D:
                    dk[h, j, c + LANES * e] = dkr[e] * scale
            for e in range(EV):
                if c + LANES * e < DV:
                    dv[h, j, c + LANES * e] = dvr[e]

    @cuda.jit
    def dq_kernel(q, k, v, do, lse, delta, dq, qscale, scale, causal):
        h, t = cuda.blockIdx.y, cuda.threadIdx.x
        i0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * ROWS          # the longest causal blocks first
        r, c = t // LANES, t % LANES
        Tq, Tk = q.shape[1], k.shape[1]
        i, offset = i0 + r, Tk - Tq
        ks = cuda.shared.array((BT, DP), dtype)
        vs = cuda.shared.array((BT, DVP), dtype)
        qr = cuda.local.array(ED, dtype)         # q * scale * log2(e), this lane's share
        dqr = cuda.local.array(ED, dtype)
        for e in range(ED):
            col = c + LANES * e
            qr[e] = q[h, i, col] * qscale if i < Tq and col < D else 0
            dqr[e] = 0
        dor = cuda.local.array(EV, dtype)
        for e in range(EV):
            col = c + LANES * e
            dor[e] = do[h, i, col] if i < Tq and col < DV else 0
        lse2_i = lse[h, i] * LOG2E if i < Tq else dtype(0)
        delta_i = delta[h, i] if i < Tq else dtype(0)
        last = min(Tk, i0 + ROWS + offset) if causal else Tk
        for j0 in range(0, last, BT):
            for idx in range(t, BT * DP, THREADS):
                j, col = idx // DP, idx % DP
                ks[j, col] = k[h, j0 + j, col] if j0 + j < Tk and col < D else 0
            for idx in range(t, BT * DVP, THREADS):
                j, col = idx // DVP, idx % DVP
                vs[j, col] = v[h, j0 + j, col] if j0 + j < Tk and col < DV else 0
            cuda.syncthreads()
            for j in range(min(BT, last - j0)):
                s = dtype(0)
                for e in range(ED):
                    s += ks[j, c + LANES * e] * qr[e]
                dp = dtype(0)
                for e in range(EV):
                    dp += vs[j, c + LANES * e] * dor[e]
                for step in (1, 2, 4):
                    s += cuda.shfl_xor_sync(ALL, s, step)
                    dp += cuda.shfl_xor_sync(ALL, dp, step)
                seen = i < Tq and j0 + j < Tk and not (causal and j0 + j > i + offset)
                p = math.exp2(s - lse2_i) if seen else dtype(0)
                ds = p * (dp - delta_i)
                for e in range(ED):
                    dqr[e] += ds * ks[j, c + LANES * e]
            cuda.syncthreads()
        if i < Tq:
            for e in range(ED):
                if c + LANES * e < D:
                    dq[h, i, c + LANES * e] = dqr[e] * scale

    return dkdv_kernel, dq_kernel


def backward(q, k, v, do, lse, delta, causal=False, scale=None):
    """(dq, dk, dv) from the inputs, the forward's lse, dO and delta = rowsum(dO * O)."""
    d, dv_size = q.shape[-1], v.shape[-1]
    if d > D_MAX or dv_size > D_MAX:
        raise ValueError(f"head size up to {D_MAX}, got d = {d}, dv = {dv_size}")
    dtype = _numba_dtype(q)
    scale = d ** -0.5 if scale is None else scale
    dq, dk, dv = (t.new_empty(t.shape) for t in (q, k, v))
    BH = q.shape[0] * q.shape[1]
    if BH == 0:
        return dq, dk, dv
    views = [kernel_view(a.flatten(0, 1).contiguous()) for a in (q, k, v, do, lse, delta)]
    dkdv_kernel, dq_kernel = backward_kernels(dtype, d, dv_size)
    launches = [(dkdv_kernel, k.shape[2], (kernel_view(dk.flatten(0, 1)), kernel_view(dv.flatten(0, 1)))),
                (dq_kernel, q.shape[2], (kernel_view(dq.flatten(0, 1)),))]
    for kernel, rows, outs in launches:
        grid = (-(-rows // ROWS), BH)
        if grid[0] == 0:
            continue
        args = (*views, *outs, dtype(scale * LOG2E), dtype(scale), causal)
        if q.is_cuda:
            stream = cuda.external_stream(torch.cuda.current_stream(q.device).cuda_stream)
            kernel[grid, THREADS, stream](*args)
        else:
            with warps.fast_switching():
                kernel[grid, THREADS](*args)
    return dq, dk, dv
