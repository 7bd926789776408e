"""The selective scan, three ways: a sequential loop, a log-depth associative scan, and chunks.

Shapes (batch b, length L, channels D, state size N):

    x, delta: (b, L, D)   A: (D, N), negative   B, C: (b, L, N)   D: (D,)

For every channel d and state n, the state runs the linear recurrence

    h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x_t          y_t = C_t·h_t + D x_t

With a_t = exp(Δ_t A) and b_t = Δ_t B_t x_t, h_t = a_t h_{t-1} + b_t. Two steps in a row compose
into one step of the same form, which makes the recurrence an associative scan (see `combine`).
"""

import contextlib
import contextvars
import math

import torch
import torch.nn.functional as F


def discretize(x, delta, A, B):
    """a_t = exp(Δ_t A) and b_t = Δ_t B_t x_t, both (b, L, D, N). Mamba uses ZOH for A, Euler for B."""
    a = torch.exp(delta[..., None] * A)                       # (b, L, D, N)
    b = delta[..., None] * B[:, :, None, :] * x[..., None]    # (b, L, D, N)
    return a, b


def readout(h, C, x, D):
    """y_t = C_t·h_t + D x_t: contract the state with C and add the skip connection."""
    return torch.einsum("bldn,bln->bld", h, C) + x * D


def selective_scan_sequential(x, delta, A, B, C, D, h0=None, return_state=False):
    """The course's answer to exercise 05.2 (`selective_scan`): read it once your check passes.

    The reference: one step per position. h0 (b, D, N) is the starting state (zeros by default)."""
    a, b = discretize(x, delta, A, B)
    h = torch.zeros_like(a[:, 0]) if h0 is None else h0
    hs = []
    for a_t, b_t in zip(a.unbind(1), b.unbind(1)):   # unbind, not a[:, t]: see below
        h = a_t * h + b_t
        hs.append(h)
    y = readout(torch.stack(hs, dim=1), C, x, D)
    return (y, h) if return_state else y


# Why `unbind` in the loops: the backward of `a[:, t]` builds a zero tensor the size of all of `a` and
# writes the gradient of one position into it, so a loop of L such reads costs O(L^2) in the backward.
# `a.unbind(1)` gives the same L views, and its backward is one `stack` of their gradients.


def combine(left, right):
    """The course's answer to exercise 05.3 (`combine`): read it once your check passes.

    Compose two steps h -> a h + b: first `left`, then `right`.

    right(left(h)) = a_r (a_l h + b_l) + b_r = (a_r a_l) h + (a_r b_l + b_r).
    It is associative (but not commutative): the order of application matters, the grouping does not.
    """
    a_l, b_l = left
    a_r, b_r = right
    return a_r * a_l, a_r * b_l + b_r


def associative_scan(a, b, dim=1):
    """The course's answer to exercise 05.4 (`parallel_scan`): read it once your check passes.

    Inclusive scan of (a, b) pairs with `combine` along `dim`, Hillis-Steele style.

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
    `torch.addcmul(c, a, b)` is c + a * b in one pass over memory instead of two.
    """
    bsz, L, Dm = x.shape
    chunk = chunk or default_chunk(L)
    n_chunks = -(-L // chunk)                             # ceil(L / chunk)
    pad = n_chunks * chunk - L
    if pad:   # Δ = 0 at the end gives identity steps (a = 1, b = 0): every real state stays the same
        x_, delta_, B_ = (F.pad(t, (0, 0, 0, pad)) for t in (x, delta, B))
    else:
        x_, delta_, B_ = x, delta, B
    a, b = discretize(x_, delta_, A, B_)
    a = a.view(bsz, n_chunks, chunk, *a.shape[2:])       # (b, n_chunks, chunk, D, N)
    b = b.view(bsz, n_chunks, chunk, *b.shape[2:])
    P = torch.cumprod(a, dim=2)                          # the product of a's since the chunk's start
    h, local = torch.zeros_like(b[:, :, 0]), []
    for a_k, b_k in zip(a.unbind(2), b.unbind(2)):       # 1. every chunk at once, position by position
        h = torch.addcmul(b_k, a_k, h)
        local.append(h)
    local = torch.stack(local, dim=2)
    h, starts = torch.zeros_like(b[:, 0, 0]), []
    for P_end, local_end in zip(P[:, :, -1].unbind(1), local[:, :, -1].unbind(1)):   # 2. chunk to chunk
        starts.append(h)
        h = torch.addcmul(local_end, P_end, h)
    h_start = torch.stack(starts, 1)[:, :, None]         # (b, n_chunks, 1, D, N)
    hs = torch.addcmul(local, P, h_start).view(bsz, n_chunks * chunk, *a.shape[3:])[:, :L]   # 3. fix up
    y = readout(hs, C, x, D)
    return (y, hs[:, -1]) if return_state else y


def default_chunk(L):
    """About sqrt(L), so that the two loops are about as long; at least 1."""
    return max(1, math.isqrt(L))


_kernel = contextvars.ContextVar("scan_kernel", default=None)


@contextlib.contextmanager
def scan_kernel(fn):
    """Inside this block, the "fused" scan (MambaConfig(scan="fused")) is fn, which takes and returns
    what `selective_scan_sequential` does (without h0). The plug-in point for a fused kernel: this
    chapter has none of its own, chapter 10 writes one."""
    token = _kernel.set(fn)
    try:
        yield fn
    finally:
        _kernel.reset(token)


def selective_scan_fused(x, delta, A, B, C, D, return_state=False):
    """The fused kernel that `scan_kernel` installed: one pass, nothing (b, L, D, N) stored."""
    fn = _kernel.get()
    if fn is None:
        raise RuntimeError('MambaConfig(scan="fused") runs the fused scan kernel installed by '
                           '`with scan_kernel(fn):`, and none is installed here: run the model inside such a '
                           'block (chapter 10 writes the kernel, and installs it that way)')
    return fn(x, delta, A, B, C, D, return_state=return_state)


SCANS = {"sequential": selective_scan_sequential, "parallel": selective_scan_parallel,
         "chunked": selective_scan_chunked, "fused": selective_scan_fused}
