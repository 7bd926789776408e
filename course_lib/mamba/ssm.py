"""The state-space model before Mamba: a continuous ODE, its discretization, and two ways to run it.

Continuous time, one input channel u(t), a state h(t) of size N, one output y(t):

    h'(t) = A h(t) + B u(t)          y(t) = C h(t)

Sampled every Δ seconds, with the input held constant over each step (zero-order hold):

    h_k = Ā h_{k-1} + B̄ u_k         y_k = C h_k
    Ā = exp(ΔA)                      B̄ = (ΔA)^{-1} (exp(ΔA) - I) ΔB

Euler's method (one straight step along the slope) gives Ā = I + ΔA, B̄ = ΔB instead: fine for a
small Δ, unstable when |ΔA| > 2. Mamba uses a diagonal A, so every formula here is elementwise.
"""

import torch


def discretize_zoh(A, B, delta):
    """The course's answer to exercise 05.1 (`discretize_zoh`): read it once your check passes.

    Zero-order hold for a diagonal A (given as its diagonal, shape (N,)): returns (Ā, B̄)."""
    dA = delta * A
    A_bar = torch.exp(dA)
    B_bar = (A_bar - 1) / dA * delta * B          # (ΔA)^{-1} (exp(ΔA) - 1) ΔB, elementwise
    return A_bar, B_bar


def discretize_euler(A, B, delta):
    """Forward Euler for a diagonal A: Ā = 1 + ΔA, B̄ = ΔB. Only close to ZOH when |ΔA| << 1."""
    return 1 + delta * A, delta * B


def ssm_recurrent(A_bar, B_bar, C, u):
    """Run h_k = Ā h_{k-1} + B̄ u_k, y_k = C·h_k over u (L,) from h = 0. One step per sample: O(L N)."""
    h = torch.zeros_like(A_bar)
    ys = []
    for u_k in u:
        h = A_bar * h + B_bar * u_k
        ys.append((C * h).sum())
    return torch.stack(ys)


def ssm_kernel(A_bar, B_bar, C, L):
    """The impulse response K_j = C Ā^j B̄ for j = 0..L-1: unrolling the recurrence gives y = K * u."""
    powers = A_bar[None, :] ** torch.arange(L, dtype=A_bar.dtype)[:, None]   # (L, N): Ā^j
    return (powers * B_bar * C).sum(-1)


def ssm_convolve(K, u):
    """Causal convolution y_k = sum_{j<=k} K_j u_{k-j}, computed with an FFT in O(L log L)."""
    L = u.shape[-1]
    n = 2 * L                                      # zero-pad so the circular convolution does not wrap
    y = torch.fft.irfft(torch.fft.rfft(u, n) * torch.fft.rfft(K, n), n)
    return y[..., :L]
