"""The fused selective scan on the CPU: discretize, scan and read out in one pass, in Numba.

This file holds the course's answer to exercise 10.2 (`fused_scan`: `scan_forward` and the kernel it
compiles, `forward_kernel`). Read it once your check passes.

Chapter 05's scans build a_t = exp(Δ_t A) and b_t = Δ_t B_t x_t as (b, L, D, N) tensors, then the
states h, another (b, L, D, N), then contract h with C. At L = 1024, D = 256, N = 16 that is 4M
numbers per tensor, written to memory and read back, for a result y of only L * D numbers.
Here each (batch, channel) pair runs its own recurrence with its N states in a small local array,
in registers and L1 cache: a_t, b_t and h_t live for one step and are never stored.

Why parallel over b * D: the recurrence is sequential in t, but the b * D pairs are independent
(they share B and C only for reading), so `prange` hands them to the cores with no locking.
Inside, the loop over the N states is innermost, contiguous in A, B, C and the state, and has no
branch: with `exp_neg` (simd/fastexp.py) LLVM turns it into SIMD instructions, 8 or 16 float32
states at once. The fastmath flags let it reorder the sum over n for y (`reassoc`) and fuse
multiply-adds (`contract`).

N, a constant. That loop runs L times per pair, and it is short: N = 16 states is one AVX-512 register
wide (two AVX2 ones). When N is a number known only at run time, LLVM wraps the vector instructions in a
loop with a count test, a remainder loop for the last N % 16 states, and checks that the state does not
overlap A, B or C, and that bookkeeping can cost as much as the arithmetic. So `scan_forward` compiles a
kernel per N (`forward_kernel(N)`, a closure in which N is a constant): the loop is unrolled into
straight vector instructions. Each N compiles once and Numba caches it; N that is not a multiple of 8
(tests, toy models) shares one kernel that reads N at run time.

The backward (see `scan_backward`) needs every h_t, and it must not store them all. It recomputes:
the forward saves the state every `chunk` steps (a checkpoint, 1/chunk of the memory), and the
backward, walking the chunks from last to first, replays one chunk's forward from its checkpoint
into a chunk-sized local buffer, then walks it backward. Recovering h_{t-1} from h_t by dividing by
a_t would be cheaper, but a_t = exp(Δ_t A) can be tiny (or 0 in float32): dividing would blow up.
"""

import functools

import numba
import numpy as np
from numba import prange

from course_lib.simd.fastexp import exp_neg

FASTMATH = {"reassoc", "contract", "nsz", "arcp"}   # not "nnan"/"ninf": a NaN input still gives NaN
GROUPS = 16  # channel groups in the backward: b * 16 tasks for the cores, each with its own (L, N) dB and dC


def scan_forward(x, delta, A, B, C, D, y, h_last, ckpt, chunk):
    """The course's answer to exercise 10.2 (`fused_scan`): read it once your check passes.

    y (b, L, D), the final state h_last (b, D, N) and the state before every chunk-th step,
    ckpt (b, ceil(L / chunk), D, N), all written in place. Inputs as in chapter 05, contiguous."""
    N = A.shape[1]
    forward_kernel(N if N % 8 == 0 else 0)(x, delta, A, B, C, D, y, h_last, ckpt, chunk)


@functools.cache
def forward_kernel(STATES):
    """The course's answer to exercise 10.2 (`fused_scan`): read it once your check passes.

    scan_forward's kernel, compiled for N = STATES states (a constant), or for any N when STATES = 0."""

    @numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
    def kernel(x, delta, A, B, C, D, y, h_last, ckpt, chunk):
        bsz, L, Dm = x.shape
        for i in prange(bsz * Dm):
            N = STATES if STATES else A.shape[1]      # inside the task, so that a constant stays one
            b, d = i // Dm, i % Dm
            h = np.zeros(N, x.dtype)                  # this channel's state: N numbers, not (L, N)
            for t in range(L):
                if t % chunk == 0:
                    for n in range(N):
                        ckpt[b, t // chunk, d, n] = h[n]
                dt, xt = delta[b, t, d], x[b, t, d]
                u = dt * xt
                acc = xt * D[d]                       # the skip connection starts the sum
                for n in range(N):                    # vectorized: no branch, contiguous, no call
                    h[n] = exp_neg(dt * A[d, n]) * h[n] + u * B[b, t, n]
                    acc += C[b, t, n] * h[n]
                y[b, t, d] = acc
            for n in range(N):
                h_last[b, d, n] = h[n]

    return kernel


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
