"""The fused selective scan on the CPU: discretize, scan and read out in one pass, in Numba.

This file holds the course's answer to exercise 10.2 (`fused_scan`: `scan_forward` and its kernel,
`forward_kernel`). Read it once your check passes.

Chapter 05's scans build a_t = exp(Δ_t A) and b_t = Δ_t B_t x_t as (b, L, D, N) tensors, then the
states h, another (b, L, D, N), then contract h with C. At L = 1024, D = 256, N = 16 that is 4M
numbers per tensor, written to memory and read back, for a result y of only L * D numbers.
Here each (batch, channel) pair runs its own recurrence with its N states in a small local array,
in registers and L1 cache: a_t, b_t and h_t live for one step and are never stored.

Why parallel over b * D: the recurrence is sequential in t, but the b * D pairs are independent
(they share B and C only for reading), so `prange` hands them to the cores with no locking, a group of
channels per task.

Vectorized over the channels. A task takes `width` neighbouring channels of one batch row (128 at most)
and runs their recurrences side by side: at each step, for each state n, one loop over the channels

    h[n, c] = exp(Δ_t[c] A[c, n]) h[n, c] + Δ_t[c] x_t[c] B_t[n]

in which Δ_t, x_t (rows of the inputs), A^T's row n (copied once per task) and h's row n are all
contiguous along c, and B_t[n] is one number. The same loop adds C_t[n] h[n, c] to y_t[c], which starts
at D[c] x_t[c]. It has no branch and `exp_neg` (simd/fastexp.py) is plain arithmetic, so LLVM turns it
into SIMD instructions, 8 or 16 float32 channels at once: y_t's sum over the states is a multiply-add
per vector of channels, with no sum across a vector's lanes. The work is one exponential per (step, channel,
state), as in the loop per channel with its N states innermost (the layout of exercise 10.2); what the
wide loops save is that loop's bookkeeping, paid L times per channel: the index arithmetic, the checks
that h does not overlap A, B or C, the lane sum of y and the loads of x, Δ and y, one number each from
another cache line. Over 128 channels it is paid once per (step, state). The fastmath flags let LLVM
fuse multiply-adds (`contract`); the sum over the states is taken state after state, in every lane alike.
The loops' lengths are numbers known at run time on purpose: with a constant such as 16 LLVM unrolls a
short loop completely and then leaves the exponentials scalar.

How wide: `scan_forward` takes 128 channels a task unless the cores would then be left without
a task (b = 1 and D = 256 on 4 cores: 64 channels each). The width changes only which channels share a
task: every channel's numbers are computed the same way.

The backward (see `scan_backward`) needs every h_t, and it must not store them all. It recomputes:
the forward saves the state every `chunk` steps (a checkpoint, 1/chunk of the memory), and the
backward, walking the chunks from last to first, replays one chunk's forward from its checkpoint
into a chunk-sized local buffer, then walks it backward. Recovering h_{t-1} from h_t by dividing by
a_t would be cheaper, but a_t = exp(Δ_t A) can be tiny (or 0 in float32): dividing would blow up.
"""

import numba
import numpy as np
from numba import prange

from course_lib.simd.fastexp import exp_neg

FASTMATH = {"reassoc", "contract", "nsz", "arcp"}   # not "nnan"/"ninf": a NaN input still gives NaN
WIDTH = 128  # channels a forward task runs side by side, at most
GROUPS = 16  # channel groups in the backward: b * 16 tasks for the cores, each with its own (L, N) dB and dC


def scan_forward(x, delta, A, B, C, D, y, h_last, ckpt, chunk):
    """The course's answer to exercise 10.2 (`fused_scan`): read it once your check passes.

    y (b, L, D), the final state h_last (b, D, N) and the state before every chunk-th step,
    ckpt (b, ceil(L / chunk), D, N), all written in place. Inputs as in chapter 05, contiguous."""
    bsz, _, Dm = x.shape
    per_row = -(-numba.get_num_threads() // bsz)          # tasks a batch row must give for every core to get one
    width = min(WIDTH, max(16, -(-Dm // per_row)))
    forward_kernel(x, delta, A, B, C, D, y, h_last, ckpt, chunk, width)


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def forward_kernel(x, delta, A, B, C, D, y, h_last, ckpt, chunk, width):
    """The course's answer to exercise 10.2 (`fused_scan`): read it once your check passes.

    scan_forward's kernel: a task per (batch row, group of `width` channels)."""
    bsz, L, Dm = x.shape
    N = A.shape[1]
    groups = -(-Dm // width)                              # groups of channels in a batch row
    for task in prange(bsz * groups):
        b = task // groups
        d0 = (task - b * groups) * width
        w = min(width, Dm - d0)                           # this group's channels: d0 .. d0 + w
        at = np.empty((N, w), x.dtype)                    # A^T: row n holds state n's A of every channel
        for c in range(w):
            for n in range(N):
                at[n, c] = A[d0 + c, n]
        h = np.zeros((N, w), x.dtype)                     # the channels' states, a state per row: not (L, N)
        u, acc = np.empty(w, x.dtype), np.empty(w, x.dtype)
        Dg = D[d0:d0 + w]
        for t in range(L):
            if t % chunk == 0:
                for c in range(w):
                    for n in range(N):
                        ckpt[b, t // chunk, d0 + c, n] = h[n, c]
            dt, xt, yt = delta[b, t, d0:d0 + w], x[b, t, d0:d0 + w], y[b, t, d0:d0 + w]
            for c in range(w):
                u[c] = dt[c] * xt[c]
                acc[c] = xt[c] * Dg[c]                    # the skip connection starts the sum
            for n in range(N):
                bn, cn, hn, an = B[b, t, n], C[b, t, n], h[n], at[n]
                for c in range(w):                        # vectorized: no branch, contiguous, no call
                    h_new = exp_neg(dt[c] * an[c]) * hn[c] + u[c] * bn
                    hn[c] = h_new
                    acc[c] += cn * h_new
            for c in range(w):
                yt[c] = acc[c]
        for c in range(w):
            for n in range(N):
                h_last[b, d0 + c, n] = h[n, c]


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def scan_backward(x, delta, A, B, C, D, ckpt, dy, dh_last, chunk,
                  dx, ddelta, dA_part, dB_part, dC_part, dD_part):
    """The gradients of every input, given dy (b, L, D) and dh_last (b, D, N), written in place.

    With g_t = dLoss/dh_t (from y_t, through C_t, and from h_{t+1}, through a_{t+1}), walking back:

        g_t = C_t dy_t + a_{t+1} g_{t+1}                      dx_t = Δ_t Σ_n g_t B_t + D dy_t
        dΔ_t = Σ_n g_t (A a_t h_{t-1} + B_t x_t)              dA += g_t Δ_t a_t h_{t-1}
        dB_t += g_t Δ_t x_t       dC_t += dy_t h_t            dD += dy_t x_t

    dB_t and dC_t sum over channels, so pairs (b, d) running in parallel would race on them. The
    work is split instead into b * G tasks (G groups of channels): a task runs its channels one
    after another and sums into its own dB_part[b, g], dC_part[b, g] (b, G, L, N); the caller adds
    the G parts. dA and dD sum over the batch: dA_part (b, D, N), dD_part (b, D), summed likewise.
    """
    bsz, L, Dm = x.shape
    N, G = A.shape[1], dB_part.shape[1]
    for task in prange(bsz * G):
        b, g = task // G, task % G
        hs = np.empty((chunk + 1, N), x.dtype)    # a chunk's states, replayed: hs[j + 1] = h_{t0 + j}
        a_s = np.empty((chunk, N), x.dtype)       # and its decays a_t
        gh = np.empty(N, x.dtype)                 # dLoss/dh carried back through time
        dA = np.empty(N, x.dtype)
        for d in range(g * Dm // G, (g + 1) * Dm // G):
            gh[:] = dh_last[b, d]
            dA[:] = 0
            dD = x.dtype.type(0)
            for c in range((L - 1) // chunk, -1, -1):
                t0, t1 = c * chunk, min(c * chunk + chunk, L)
                hs[0] = ckpt[b, c, d]
                for t in range(t0, t1):           # 1. replay the chunk's forward from its checkpoint
                    j, dt = t - t0, delta[b, t, d]
                    u = dt * x[b, t, d]
                    for n in range(N):
                        a_s[j, n] = exp_neg(dt * A[d, n])
                        hs[j + 1, n] = a_s[j, n] * hs[j, n] + u * B[b, t, n]
                for t in range(t1 - 1, t0 - 1, -1):   # 2. then walk it backward
                    j, dt, xt, gy = t - t0, delta[b, t, d], x[b, t, d], dy[b, t, d]
                    s_x = s_dt = x.dtype.type(0)
                    for n in range(N):
                        gt = gh[n] + C[b, t, n] * gy                # g_t
                        ga = gt * hs[j, n] * a_s[j, n]              # dLoss/d(Δ_t A) = g_t h_{t-1} a_t
                        s_x += gt * B[b, t, n]
                        s_dt += ga * A[d, n]
                        dA[n] += ga * dt
                        dB_part[b, g, t, n] += gt * dt * xt
                        dC_part[b, g, t, n] += gy * hs[j + 1, n]
                        gh[n] = gt * a_s[j, n]                      # g_{t-1}'s share through h_t
                    dx[b, t, d] = s_x * dt + D[d] * gy
                    ddelta[b, t, d] = s_dt + s_x * xt
                    dD += gy * xt
            dA_part[b, d, :] = dA
            dD_part[b, d] = dD
