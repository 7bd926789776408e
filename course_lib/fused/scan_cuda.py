"""The fused selective scan as Numba CUDA kernels: one thread per (batch, channel).

The same plan as scan_cpu.py, with threads where the CPU had `prange` tasks. The forward kernel is
the course's answer to exercise 10.2 (`fused_scan`) on a GPU: read it once your check passes.

- forward: thread (b, d) runs its channel's recurrence over t with its N states in a local array
  (registers or the thread's local memory), and writes y, the final state and the checkpoints;
- backward: thread (b, d) replays each chunk from its checkpoint into a scratch buffer in global
  memory (its own slice of (b, D, chunk + 1, N): the local memory of a GPU thread is small), then
  walks it backward. dB and dC sum over channels, so the b * D threads add into them with
  `cuda.atomic.add` (a GPU has too many threads to give each group its own copy, as the CPU does).

The state is kept in float64 whatever the inputs' type (`cuda.local.array` needs its type when the
kernel compiles), and `math.exp` is fine here: the GPU has its own fast exponential.
Without a GPU the kernels run on Numba's simulator on the `.numpy()` views of CPU tensors, slowly
(about 130 µs per thread): keep b * D to a few hundred there. See chapter 08 for the launch details.
"""

from course_lib import device

device.setup(verbose=False)

import math  # noqa: E402

import torch  # noqa: E402
from numba import cuda, float64  # noqa: E402  (after the device is chosen)

from course_lib.custom_ops.numba_cuda import kernel_view  # noqa: E402

N_MAX = 64        # the most states per channel (the local arrays' size)
THREADS = 64      # threads per block


@cuda.jit
def scan_forward_kernel(x, delta, A, B, C, D, y, h_last, ckpt, chunk):
    """The course's answer to exercise 10.2 (`fused_scan`): read it once your check passes.

    scan_cpu.py's forward with a thread per (batch, channel): y, h_last and the checkpoints, in place."""
    i = cuda.grid(1)
    bsz, L, Dm = x.shape
    N = A.shape[1]
    if i >= bsz * Dm:
        return
    b, d = i // Dm, i % Dm
    h = cuda.local.array(N_MAX, float64)
    for n in range(N):
        h[n] = 0.0
    for t in range(L):
        if t % chunk == 0:
            for n in range(N):
                ckpt[b, t // chunk, d, n] = h[n]
        dt, xt = float64(delta[b, t, d]), float64(x[b, t, d])
        acc = xt * D[d]
        for n in range(N):
            h[n] = math.exp(dt * A[d, n]) * h[n] + dt * xt * B[b, t, n]
            acc += C[b, t, n] * h[n]
        y[b, t, d] = acc
    for n in range(N):
        h_last[b, d, n] = h[n]


@cuda.jit
def scan_backward_kernel(x, delta, A, B, C, D, ckpt, dy, dh_last, chunk, hs, a_s,
                         dx, ddelta, dA_part, dB, dC, dD_part):
    """The CPU backward's formulas; hs (b, D, chunk + 1, N) and a_s (b, D, chunk, N) are scratch."""
    i = cuda.grid(1)
    bsz, L, Dm = x.shape
    N = A.shape[1]
    if i >= bsz * Dm:
        return
    b, d = i // Dm, i % Dm
    gh = cuda.local.array(N_MAX, float64)
    dA = cuda.local.array(N_MAX, float64)
    for n in range(N):
        gh[n], dA[n] = dh_last[b, d, n], 0.0
    dD = 0.0
    for c in range((L - 1) // chunk, -1, -1):
        t0, t1 = c * chunk, min(c * chunk + chunk, L)
        for n in range(N):
            hs[b, d, 0, n] = ckpt[b, c, d, n]
        for t in range(t0, t1):                               # replay the chunk
            j, dt = t - t0, float64(delta[b, t, d])
            for n in range(N):
                a_s[b, d, j, n] = math.exp(dt * A[d, n])
                hs[b, d, j + 1, n] = a_s[b, d, j, n] * hs[b, d, j, n] + dt * x[b, t, d] * B[b, t, n]
        for t in range(t1 - 1, t0 - 1, -1):                   # and walk it backward
            j, dt, xt, gy = t - t0, float64(delta[b, t, d]), float64(x[b, t, d]), float64(dy[b, t, d])
            s_x = s_dt = 0.0
            for n in range(N):
                gt = gh[n] + C[b, t, n] * gy
                ga = gt * hs[b, d, j, n] * a_s[b, d, j, n]
                s_x += gt * B[b, t, n]
                s_dt += ga * A[d, n]
                dA[n] += ga * dt
                cuda.atomic.add(dB, (b, t, n), gt * dt * xt)
                cuda.atomic.add(dC, (b, t, n), gy * hs[b, d, j + 1, n])
                gh[n] = gt * a_s[b, d, j, n]
            dx[b, t, d] = s_x * dt + D[d] * gy
            ddelta[b, t, d] = s_dt + s_x * xt
            dD += gy * xt
    for n in range(N):
        dA_part[b, d, n] = dA[n]
    dD_part[b, d] = dD


def _launch(kernel, threads, *args):
    """Run `kernel` with one thread per (b, d); on a GPU, on torch's current stream."""
    blocks = (threads + THREADS - 1) // THREADS
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    views = [kernel_view(a) if isinstance(a, torch.Tensor) else a for a in args]
    if threads == 0:
        return
    if tensors[0].is_cuda:
        stream = cuda.external_stream(torch.cuda.current_stream(tensors[0].device).cuda_stream)
        kernel[blocks, THREADS, stream](*views)
    else:
        kernel[blocks, THREADS](*views)


def _check(x, A):
    if A.shape[1] > N_MAX:
        raise ValueError(f"the CUDA scan keeps at most N_MAX = {N_MAX} states per channel, got {A.shape[1]}")
    return x.shape[0] * x.shape[2]


def scan_forward(x, delta, A, B, C, D, chunk):
    """(y, h_last, ckpt) as scan_cpu.scan_forward writes them. Contiguous inputs of one dtype."""
    bsz, L, Dm = x.shape
    N = A.shape[1]
    y, h_last = x.new_empty(bsz, L, Dm), x.new_empty(bsz, Dm, N)
    ckpt = x.new_empty(bsz, -(-L // chunk), Dm, N)
    _launch(scan_forward_kernel, _check(x, A), x, delta, A, B, C, D, y, h_last, ckpt, chunk)
    return y, h_last, ckpt


def scan_backward(x, delta, A, B, C, D, ckpt, dy, dh_last, chunk):
    """(dx, ddelta, dA, dB, dC, dD): the gradients of every input."""
    bsz, L, Dm = x.shape
    N = A.shape[1]
    hs, a_s = x.new_empty(bsz, Dm, chunk + 1, N), x.new_empty(bsz, Dm, chunk, N)
    dx, ddelta = x.new_empty(bsz, L, Dm), x.new_empty(bsz, L, Dm)
    dA_part, dD_part = x.new_empty(bsz, Dm, N), x.new_empty(bsz, Dm)
    dB, dC = x.new_zeros(bsz, L, N), x.new_zeros(bsz, L, N)
    _launch(scan_backward_kernel, _check(x, A), x, delta, A, B, C, D, ckpt, dy, dh_last, chunk, hs, a_s,
            dx, ddelta, dA_part, dB, dC, dD_part)
    return dx, ddelta, dA_part.sum(0), dB, dC, dD_part.sum(0)
