"""Tiled attention as a PyTorch op: `attention(q, k, v, causal)` for q, k, v of shape (B, H, T, d).

Two ops registered with torch.library.custom_op (chapter 08 explains the machinery):

- `course::attention` returns (out, lse): the Numba kernel on CPU tensors (attention_cpu.py), the
  Numba CUDA kernel on CUDA tensors (attention_cuda.py). lse (B, H, Tq) is what the backward needs.
- `course::attention_backward` returns (dq, dk, dv) from q, k, v, out, lse and dO.

The backward is an op of its own, not Python code inside the autograd formula, because torch.compile
and `opcheck` trace the backward with fake tensors, which have no numbers to hand to Numba. lse is an
output so that the backward can have it, and it is marked non-differentiable: its gradient would add
g_i P_ij to every dS_ij, an input the kernels do not take.

`naive_attention` is the textbook version that materializes the (B, H, Tq, Tk) scores: the
reference the fused op is measured against.
"""

import torch

from course_lib.custom_ops.functions import as_numpy
from course_lib.fused import attention_cpu


def _flat(t):
    """(B, H, T, d) tensor -> contiguous (B*H, T, d) numpy view."""
    return as_numpy(t).reshape(-1, *t.shape[2:])


@torch.library.custom_op("course::attention", mutates_args=(), device_types="cpu")
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                      scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, Tq, dv), lse (B, H, Tq)) with the tiled online-softmax kernel."""
    out, lse = attention_cpu.forward(_flat(q), _flat(k), _flat(v), causal, scale)
    B, H, Tq = q.shape[:3]
    return torch.from_numpy(out).view(B, H, Tq, -1), torch.from_numpy(lse).view(B, H, Tq)


@attention_forward.register_kernel("cuda")
def _(q, k, v, causal, scale):
    from course_lib.fused import attention_cuda  # numba.cuda is loaded only when a CUDA tensor comes

    return attention_cuda.forward(q, k, v, causal, scale)


@attention_forward.register_fake
def _(q, k, v, causal, scale):
    return q.new_empty(*q.shape[:3], v.shape[-1]), q.new_empty(q.shape[:3])


@torch.library.custom_op("course::attention_backward", mutates_args=(), device_types="cpu")
def attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), recomputing the probabilities tile by tile from lse."""
    grads = attention_cpu.backward(_flat(q), _flat(k), _flat(v), _flat(out), _flat(do), _flat(lse), causal, scale)
    return tuple(torch.from_numpy(g).view(t.shape) for g, t in zip(grads, (q, k, v)))


@attention_backward.register_kernel("cuda")
def _(do, q, k, v, out, lse, causal, scale):
    from course_lib.fused import attention_cuda

    return attention_cuda.backward(q, k, v, do, lse, (do * out).sum(-1), causal, scale)


@attention_backward.register_fake
def _(do, q, k, v, out, lse, causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)       # O(T d) per head: no T x T matrix is kept
    ctx.mark_non_differentiable(lse)
    ctx.causal, ctx.scale = causal, scale


def _backward(ctx, dout, _):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(dout.contiguous(), q, k, v, out, lse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


attention_forward.register_autograd(_backward, setup_context=_setup_context)


def attention(q, k, v, causal=False, scale=None):
    """softmax(q k^T * scale [+ causal mask]) v for q (B, H, Tq, d), k (B, H, Tk, d), v (B, H, Tk, dv).

    scale defaults to 1/sqrt(d). With causal=True, query i sees key j when j <= i + Tk - Tq (the
    queries are the last Tq positions), which is F.scaled_dot_product_attention's is_causal when Tq == Tk.
    """
    scale = q.size(-1) ** -0.5 if scale is None else float(scale)
    return attention_forward(q, k, v, causal, scale)[0]


def naive_attention(q, k, v, causal=False, scale=None):
    """The same result, with the (B, H, Tq, Tk) scores and probabilities built in memory."""
    scale = q.size(-1) ** -0.5 if scale is None else scale
    s = q @ k.transpose(-2, -1) * scale
    if causal:
        Tq, Tk = s.shape[-2:]
        s = s.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool, device=s.device).triu(Tk - Tq + 1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v
