"""The selective scan, three ways: a sequential loop, a log-depth associative scan, and chunks.

Shapes (batch b, length L, channels D, state size N):

    x, delta: (b, L, D)   A: (D, N), negative   B, C: (b, L, N)   D: (D,)

For every channel d and state n, the state runs the linear recurrence

    h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x_t          y_t = C_t·h_t + D x_t

With a_t = exp(Δ_t A) and b_t = Δ_t B_t x_t, h_t = a_t h_{t-1} + b_t. Two steps in a row compose
into one step of the same form, which makes the recurrence an associative scan (see `combine`).
"""

import math

import torch


def discretize(x, delta, A, B):
    """a_t = exp(Δ_t A) and b_t = Δ_t B_t x_t, both (b, L, D, N). Mamba uses ZOH for A, Euler for B."""
    a = torch.exp(delta[..., None] * A)                       # (b, L, D, N)
    b = delta[..., None] * B[:, :, None, :] * x[..., None]    # (b, L, D, N)
    return a, b


def readout(h, C, x, D):
    """y_t = C_t·h_t + D x_t: contract the state with C and add the skip connection."""
    return torch.einsum("bldn,bln->bld", h, C) + x * D


def selective_scan_sequential(x, delta, A, B, C, D, h0=None, return_state=False):
    """The reference: one step per position. h0 (b, D, N) is the starting state (zeros by default)."""
    a, b = discretize(x, delta, A, B)
    h = torch.zeros_like(a[:, 0]) if h0 is None else h0
    hs = []
    for t in range(x.shape[1]):
        h = a[:, t] * h + b[:, t]
        hs.append(h)
    y = readout(torch.stack(hs, dim=1), C, x, D)
    return (y, h) if return_state else y


def combine(left, right):
    """Compose two steps h -> a h + b: first `left`, then `right`.

    right(left(h)) = a_r (a_l h + b_l) + b_r = (a_r a_l) h + (a_r b_l + b_r).
    It is associative (but not commutative): the order of application matters, the grouping does not.
    """
    a_l, b_l = left
    a_r, b_r = right
    return a_r * a_l, a_r * b_l + b_r


def associative_scan(a, b, dim=1):
    """Inclusive scan of (a, b) pairs with `combine` along `dim`, Hillis-Steele style.

    After round k each position holds the composition of the last 2^k steps ending there, so
    ceil(log2 L) rounds finish, each one vectorized over the whole sequence. Returns the composed
    steps from the start: (P_t, h_t) with P_t = a_1 ... a_t and h_t the state reached from h = 0.
    Work is O(L log L) against the loop's O(L), but the depth is log L instead of L.
    """
    L = a.shape[dim]
    step = 1
    while step < L:
        earlier = (a.narrow(dim, 0, L - step), b.narrow(dim, 0, L - step))
        later = (a.narrow(dim, step, L - step), b.narrow(dim, step, L - step))
        a_new, b_new = combine(earlier, later)
        a = torch.cat([a.narrow(dim, 0, step), a_new], dim)   # the first `step` positions are done
        b = torch.cat([b.narrow(dim, 0, step), b_new], dim)
        step *= 2
    return a, b


def selective_scan_parallel(x, delta, A, B, C, D, return_state=False):
    """The selective scan with `associative_scan` over the sequence: log2(L) vectorized rounds."""
    a, b = discretize(x, delta, A, B)
    _, h = associative_scan(a, b, dim=1)
    y = readout(h, C, x, D)
    return (y, h[:, -1]) if return_state else y


def selective_scan_chunked(x, delta, A, B, C, D, chunk=None, return_state=False):
    """Cut the sequence into chunks of `chunk` positions (default about sqrt(L)) and scan in two levels.

    1. Inside the chunks, all chunks at once: a loop over the `chunk` positions of a chunk gives each
       position's state from h = 0 at its chunk's start (h_local), and P, the product of the a's so far.
    2. Across the chunks: a loop over the L / chunk chunks carries the true state at each chunk's end,
       h_end(c) = P_end(c) h_end(c-1) + h_local_end(c).
    3. Then every position at once: h_t = P_t h_start + h_local_t.

    Two short loops of about sqrt(L) steps instead of one of L, and O(L) work, unlike the log-depth scan.
    """
    bsz, L, Dm = x.shape
    chunk = chunk or max(1, math.isqrt(L))
    a, b = discretize(x, delta, A, B)
    n_chunks = math.ceil(L / chunk)
    pad = n_chunks * chunk - L
    if pad:   # identity steps (a = 1, b = 0) at the end leave every real state unchanged
        a = torch.cat([a, a.new_ones(bsz, pad, *a.shape[2:])], 1)
        b = torch.cat([b, b.new_zeros(bsz, pad, *b.shape[2:])], 1)
    a = a.view(bsz, n_chunks, chunk, *a.shape[2:])
    b = b.view(bsz, n_chunks, chunk, *b.shape[2:])
    P = torch.cumprod(a, dim=2)                          # the product of a's since the chunk's start
    h, local = torch.zeros_like(b[:, :, 0]), []
    for k in range(chunk):                               # 1. every chunk at once, position by position
        h = a[:, :, k] * h + b[:, :, k]
        local.append(h)
    local = torch.stack(local, dim=2)
    h, starts = torch.zeros_like(b[:, 0, 0]), []
    for c in range(n_chunks):                            # 2. carry the state from chunk to chunk
        starts.append(h)
        h = P[:, c, -1] * h + local[:, c, -1]
    h_start = torch.stack(starts, 1)[:, :, None]         # (b, n_chunks, 1, D, N)
    hs = (P * h_start + local).view(bsz, n_chunks * chunk, *a.shape[3:])[:, :L]   # 3. fix up
    y = readout(hs, C, x, D)
    return (y, hs[:, -1]) if return_state else y


SCANS = {"sequential": selective_scan_sequential, "parallel": selective_scan_parallel,
         "chunked": selective_scan_chunked}
