"""The selective scan at GPU speed: the kernels the chapter's op runs on CUDA tensors.

scan_cuda.py teaches the plan with one thread per (batch, channel) and its N states in an array sized
N_MAX, in float64. This file keeps the plan and puts each number where a GPU wants it:

- **Compile time.** N (the states per channel) and the dtype are constants of the kernel:
  `forward_kernel(dtype, N)` compiles one kernel per pair (functools.cache). Every loop over the states
  has a known length, so the compiler unrolls it and the N states live in registers.
- **A block** owns one batch row b and CHANNELS = 32 neighbouring channels, one thread each (one warp):
  neighbouring threads read and write neighbouring addresses of x, Δ and y.
- **Chunks over L.** The block walks the sequence STAGE positions at a time. B_t and C_t are the same
  for every channel of the block: its threads load STAGE rows of them into shared memory together,
  once. x and Δ come into shared memory the same way (thread t loads its channel's STAGE values), so
  the loads of a whole chunk are in flight at once instead of one position's at a time.
- **Registers.** The states h[n], and A[d, n] * log2(e), so that each decay exp(Δ A) is one `exp2`.
  Everything is computed in the inputs' dtype (fp32 on the GPU benchmark).
- **For the backward**, the state at the start of each `chunk` of positions goes to `ckpt`, as the
  CPU kernel writes it, and the last state to `h_last`. The backward (at the end of the file) uses the
  same blocks and registers, and replays each chunk from its checkpoint.

On Numba's simulator (no GPU) the same kernel runs with each thread as a Python thread; keep b * D to a
few dozen there.
"""

import functools
import math

from course_lib import device

device.setup(verbose=False)

import numba  # noqa: E402
import torch  # noqa: E402
from numba import cuda  # noqa: E402  (after the device is chosen)

from course_lib.custom_ops.numba_cuda import kernel_view  # noqa: E402

CHANNELS = 32      # channels per block, one thread each
STAGE = 16         # positions loaded at a time
N_MAX = 64         # the most states per channel
LOG2E = 1.4426950408889634


@functools.cache
def forward_kernel(dtype, N):
    """The forward kernel for one numba dtype and N states per channel, compiled on first use."""

    @cuda.jit
    def kernel(x, delta, A, B, C, D, y, h_last, ckpt, chunk):
        b, t = cuda.blockIdx.y, cuda.threadIdx.x
        d = cuda.blockIdx.x * CHANNELS + t
        L, Dm = x.shape[1], x.shape[2]
        live = d < Dm                                        # the last block may have idle threads
        h = cuda.local.array(N, dtype)                       # the state, in registers
        a2 = cuda.local.array(N, dtype)                      # A[d, n] * log2(e)
        bs = cuda.shared.array((STAGE, N), dtype)            # B_t and C_t, shared by the block's channels
        cs = cuda.shared.array((STAGE, N), dtype)
        xs = cuda.shared.array((STAGE, CHANNELS), dtype)     # x_t and Δ_t of the block's channels
        ds = cuda.shared.array((STAGE, CHANNELS), dtype)
        for n in range(N):
            h[n] = 0
            a2[n] = A[d, n] * LOG2E if live else 0
        skip = D[d] if live else dtype(0)
        saved = 0                                            # the next position whose state goes to ckpt
        for s0 in range(0, L, STAGE):
            for idx in range(t, STAGE * N, CHANNELS):
                j, n = idx // N, idx % N
                bs[j, n] = B[b, s0 + j, n] if s0 + j < L else 0
                cs[j, n] = C[b, s0 + j, n] if s0 + j < L else 0
            for j in range(STAGE):
                inside = live and s0 + j < L
                xs[j, t] = x[b, s0 + j, d] if inside else dtype(0)
                ds[j, t] = delta[b, s0 + j, d] if inside else dtype(0)
            cuda.syncthreads()
            if live:
                for j in range(STAGE):
                    tt = s0 + j
                    if tt < L:
                        if tt == saved:                      # the state before this chunk, for the backward
                            for n in range(N):
                                ckpt[b, tt // chunk, d, n] = h[n]
                            saved += chunk
                        dt, xt = ds[j, t], xs[j, t]
                        acc = xt * skip
                        for n in range(N):
                            h[n] = math.exp2(dt * a2[n]) * h[n] + dt * xt * bs[j, n]
                            acc += cs[j, n] * h[n]
                        y[b, tt, d] = acc
            cuda.syncthreads()                               # before the next chunk overwrites bs and cs
        if live:
            for n in range(N):
                h_last[b, d, n] = h[n]

    return kernel


def scan_forward(x, delta, A, B, C, D, chunk):
    """(y, h_last, ckpt) as scan_cpu.scan_forward writes them. Contiguous inputs of one dtype."""
    bsz, L, Dm = x.shape
    N = A.shape[1]
    if N > N_MAX:
        raise ValueError(f"the CUDA scan keeps at most N_MAX = {N_MAX} states per channel, got {N}")
    y, h_last = x.new_empty(bsz, L, Dm), x.new_empty(bsz, Dm, N)
    ckpt = x.new_empty(bsz, -(-L // chunk), Dm, N)
    grid = (-(-Dm // CHANNELS), bsz)
    if bsz * Dm == 0:
        return y, h_last, ckpt
    dtype = {torch.float32: numba.float32, torch.float64: numba.float64}[x.dtype]
    kernel = forward_kernel(dtype, N)
    views = [kernel_view(a) for a in (x, delta, A, B, C, D, y, h_last, ckpt)]
    if x.is_cuda:
        stream = cuda.external_stream(torch.cuda.current_stream(x.device).cuda_stream)
        kernel[grid, CHANNELS, stream](*views, chunk)
    else:
        kernel[grid, CHANNELS](*views, chunk)
    return y, h_last, ckpt


# ---- the backward ------------------------------------------------------------------------------------
#
# The same blocks walk the sequence backward, one checkpointed chunk at a time, and inside it SUB
# positions at a time from the end: each thread replays its channel from the chunk's checkpoint (in
# registers, nothing stored) up to the sub-chunk, then replays the sub-chunk storing its states in
# shared memory, then walks it backward with the CPU kernel's formulas. dB and dC sum over channels:
# the block adds its 32 channels' shares in shared memory and writes one partial sum per group of
# channels (dB_part, dC_part), which torch adds up: no atomics, the same result on every run.


@functools.cache
def backward_kernel(dtype, N):
    """The backward kernel for one numba dtype and N states per channel, compiled on first use."""
    HS = max(2, 1024 // (N * (4 if dtype == numba.float32 else 8)))    # states kept: 32 KiB of shared memory
    SUB = HS - 1                                                        # positions walked back at a time
    R = 2 * N                                                           # rows of the channel sums: dB, dC

    @cuda.jit
    def kernel(x, delta, A, B, C, D, ckpt, dy, dh_last, chunk,
               dx, ddelta, dA_part, dB_part, dC_part, dD_part):
        b, t, g = cuda.blockIdx.y, cuda.threadIdx.x, cuda.blockIdx.x
        d = g * CHANNELS + t
        L, Dm = x.shape[1], x.shape[2]
        live = d < Dm
        gh = cuda.local.array(N, dtype)                      # dLoss / dh, carried backward
        dA = cuda.local.array(N, dtype)
        a2 = cuda.local.array(N, dtype)
        h = cuda.local.array(N, dtype)
        hs = cuda.shared.array((HS, N, CHANNELS), dtype)     # the sub-chunk's states, for every channel
        sums = cuda.shared.array((R, CHANNELS), dtype)       # each channel's share of dB and dC at one t
        for n in range(N):
            gh[n] = dh_last[b, d, n] if live else 0
            dA[n] = 0
            a2[n] = A[d, n] * LOG2E if live else 0
        skip = D[d] if live else dtype(0)
        dD = dtype(0)
        for c in range((L - 1) // chunk, -1, -1):
            t0, t1 = c * chunk, min(c * chunk + chunk, L)
            for u0 in range(t0 + (t1 - t0 - 1) // SUB * SUB, t0 - 1, -SUB):
                u1 = min(u0 + SUB, t1)
                for n in range(N):
                    h[n] = ckpt[b, c, d, n] if live else 0
                for tt in range(t0, u1):                     # replay from the checkpoint
                    if tt >= u0:
                        for n in range(N):
                            hs[tt - u0, n, t] = h[n]
                    dt = delta[b, tt, d] if live else dtype(0)
                    dtx = dt * x[b, tt, d] if live else dtype(0)
                    for n in range(N):
                        h[n] = math.exp2(dt * a2[n]) * h[n] + dtx * B[b, tt, n]
                for n in range(N):
                    hs[u1 - u0, n, t] = h[n]
                for tt in range(u1 - 1, u0 - 1, -1):         # and walk it backward
                    j = tt - u0
                    dt = delta[b, tt, d] if live else dtype(0)
                    xt = x[b, tt, d] if live else dtype(0)
                    gy = dy[b, tt, d] if live else dtype(0)
                    s_x, s_dt = dtype(0), dtype(0)
                    for n in range(N):
                        a = math.exp2(dt * a2[n])
                        gt = gh[n] + C[b, tt, n] * gy
                        ga = gt * hs[j, n, t] * a
                        s_x += gt * B[b, tt, n]
                        s_dt += ga * a2[n]
                        dA[n] += ga * dt
                        sums[n, t] = gt * dt * xt
                        sums[N + n, t] = gy * hs[j + 1, n, t]
                        gh[n] = gt * a
                    if live:
                        dx[b, tt, d] = s_x * dt + skip * gy
                        ddelta[b, tt, d] = s_dt / LOG2E + s_x * xt
                    dD += gy * xt
                    cuda.syncthreads()
                    for row in range(t, R, CHANNELS):            # add the block's channels up
                        total = dtype(0)
                        for ch in range(CHANNELS):
                            total += sums[row, ch]
                        if row < N:
                            dB_part[g, b, tt, row] = total
                        else:
                            dC_part[g, b, tt, row - N] = total
                    cuda.syncthreads()
        if live:
            for n in range(N):
                dA_part[b, d, n] = dA[n]
            dD_part[b, d] = dD

    return kernel


def scan_backward(x, delta, A, B, C, D, ckpt, dy, dh_last, chunk):
    """(dx, ddelta, dA, dB, dC, dD): the gradients of every input, from scan_forward's checkpoints."""
    bsz, L, Dm = x.shape
    N = A.shape[1]
    groups = -(-Dm // CHANNELS)
    dx, ddelta = x.new_zeros(bsz, L, Dm), x.new_zeros(bsz, L, Dm)
    dA_part, dD_part = x.new_zeros(bsz, Dm, N), x.new_zeros(bsz, Dm)
    dB_part, dC_part = x.new_zeros(groups, bsz, L, N), x.new_zeros(groups, bsz, L, N)
    if bsz * Dm * L:
        dtype = {torch.float32: numba.float32, torch.float64: numba.float64}[x.dtype]
        kernel = backward_kernel(dtype, N)
        args = [kernel_view(a) for a in (x, delta, A, B, C, D, ckpt, dy, dh_last)] + [chunk]
        args += [kernel_view(a) for a in (dx, ddelta, dA_part, dB_part, dC_part, dD_part)]
        if x.is_cuda:
            stream = cuda.external_stream(torch.cuda.current_stream(x.device).cuda_stream)
            kernel[(groups, bsz), CHANNELS, stream](*args)
        else:
            kernel[(groups, bsz), CHANNELS](*args)
    return dx, ddelta, dA_part.sum(0), dB_part.sum(0), dC_part.sum(0), dD_part.sum(0)
