"""Mamba's selective scan (chapter 05) as a CUDA kernel.

For each batch b and channel d, with a state h of N numbers:

    h_t = exp(dt_t * A) * h_{t-1} + dt_t * B_t * x_t        (elementwise over the N states)
    y_t = C_t . h_t + D * x_t

The recurrence is sequential in t but independent across (b, d, n). One block per
(d, b), one thread per state n: each thread carries its h[n] through time, and at
every step the block sums C_t[n] * h[n] over n in shared memory.
"""

import math

import numpy as np
from numba import cuda

from course_lib.cuda.launch import launch

MAX_N = 32   # most states per channel (threads per block)


def selective_scan_reference(x, dt, A, B, C, D):
    """Plain sequential numpy. x, dt: (batch, L, d); A: (d, N); B, C: (batch, L, N); D: (d,)."""
    batch, L, d = x.shape
    h = np.zeros((batch, d, A.shape[1]))
    y = np.empty((batch, L, d))
    for t in range(L):
        decay = np.exp(dt[:, t, :, None] * A)                              # (batch, d, N)
        h = decay * h + dt[:, t, :, None] * B[:, t, None, :] * x[:, t, :, None]
        y[:, t] = np.einsum("bdn,bn->bd", h, C[:, t]) + D * x[:, t]
    return y


@cuda.jit
def k_selective_scan(x, dt, A, B, C, D, y):
    n = cuda.threadIdx.x
    d, b = cuda.blockIdx.x, cuda.blockIdx.y
    N = A.shape[1]
    buf = cuda.shared.array(MAX_N, np.float64)
    h = 0.0
    for t in range(x.shape[1]):
        if n < N:
            step = dt[b, t, d]
            h = math.exp(step * A[d, n]) * h + step * B[b, t, n] * x[b, t, d]   # math.exp: a GPU has no np.exp
            buf[n] = C[b, t, n] * h
        else:
            buf[n] = 0.0
        cuda.syncthreads()
        half = cuda.blockDim.x // 2
        while half > 0:                     # tree sum of C_t[n] * h[n] over n
            if n < half:
                buf[n] += buf[n + half]
            cuda.syncthreads()
            half //= 2
        if n == 0:
            y[b, t, d] = buf[0] + D[d] * x[b, t, d]
        cuda.syncthreads()                  # buf is reused at the next step


def selective_scan(x, dt, A, B, C, D):
    """The kernel on float64 numpy arrays; returns y of shape (batch, L, d)."""
    batch, L, d = x.shape
    assert A.shape[1] <= MAX_N, f"at most MAX_N={MAX_N} states"
    y = np.empty((batch, L, d))
    args = [np.ascontiguousarray(v, np.float64) for v in (x, dt, A, B, C, D)]
    threads = 1 << max(A.shape[1] - 1, 1).bit_length()      # a power of two >= N
    launch(k_selective_scan, (d, batch), threads, *args, y)
    return y
