"""Attention as a PyTorch op: `attention(q, k, v, causal)` for q, k, v of shape (B, H, T, d).

This file holds the course's answer to exercise 10.6 (`attention_op`: `register`). Read it once your
check passes.

`register(name, forward_kernel, backward_kernel)` wraps a pair of kernels with the signatures of
attention_cpu.py's in two ops, made with torch.library.custom_op (chapter 08 explains the machinery):

    name(q, k, v, causal, scale) -> (out, lse)                              the forward kernel
    name_backward(q, k, v, out, dout, lse, causal, scale) -> (dq, dk, dv)   the backward kernel

and gives the first a fake (the shapes of its outputs, for tracing) and an autograd formula that
calls the second. The course's op, `course::attention`, is that function applied to the course's
kernels, plus the Numba CUDA kernels (attention_cuda.py) for CUDA tensors.

- The kernels take (B*H, T, d) numpy arrays and write their outputs in place. A tensor arriving here
  may be a view with any strides (the GPT hands over q.transpose(1, 2)): `_heads` makes it contiguous
  before viewing it as numpy, and every output is allocated contiguous, so the kernel's writes land
  in the tensor that is returned.
- The backward is an op of its own, not Python code inside the autograd formula, because
  torch.compile and `opcheck` trace the backward with fake tensors, which have no numbers to hand
  to a Numba kernel.
- lse is an output so that the backward can have it: saved for the backward, O(T) per head, where P
  would be O(T^2). It is marked non-differentiable (its gradient would add g_i P_ij to every dS_ij,
  an input the backward kernel does not take).

`naive_attention` is the textbook version that materializes the (B, H, Tq, Tk) scores.
"""

import torch

from course_lib.fused import attention_cpu

Tensor = torch.Tensor


def _heads(t):
    """(B, H, T, ...) tensor -> contiguous (B*H, T, ...) numpy view (a copy only if t was not contiguous)."""
    return t.detach().contiguous().reshape(-1, *t.shape[2:]).numpy()


def register(name, forward_kernel, backward_kernel, forward_tiles=attention_cpu.FORWARD_TILES,
             backward_tiles=attention_cpu.BACKWARD_TILES):
    """The course's answer to exercise 10.6 (`attention_op`): read it once your check passes.

    The op `name` ("namespace::name") around the kernels, with a fake, and `name_backward` for autograd.
    The kernels run with (BQ, BK) = forward_tiles and backward_tiles."""

    @torch.library.custom_op(name, mutates_args=())
    def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
        out = q.new_empty(*q.shape[:3], v.shape[-1])
        lse = q.new_empty(q.shape[:3])
        qn = _heads(q)
        forward_kernel(qn, _heads(k), _heads(v), _heads(out), _heads(lse), qn.dtype.type(scale), causal, *forward_tiles)
        return out, lse

    @attention.register_fake
    def _(q, k, v, causal, scale):
        return q.new_empty(*q.shape[:3], v.shape[-1]), q.new_empty(q.shape[:3])

    @torch.library.custom_op(name + "_backward", mutates_args=())
    def attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor, causal: bool,
                           scale: float) -> tuple[Tensor, Tensor, Tensor]:
        dq, dk, dv = (t.new_empty(t.shape) for t in (q, k, v))     # contiguous, whatever q, k, v are
        qn = _heads(q)
        backward_kernel(qn, _heads(k), _heads(v), _heads(out), _heads(dout), _heads(lse),
                        _heads(dq), _heads(dk), _heads(dv), qn.dtype.type(scale), causal, *backward_tiles)
        return dq, dk, dv

    @attention_backward.register_fake
    def _(q, k, v, out, dout, lse, causal, scale):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    def setup_context(ctx, inputs, output):
        q, k, v, causal, scale = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse)       # O(T d) per head: no T x T matrix is kept
        ctx.mark_non_differentiable(lse)
        ctx.causal, ctx.scale = causal, scale

    def backward(ctx, dout, _):
        q, k, v, out, lse = ctx.saved_tensors
        return *attention_backward(q, k, v, out, dout, lse, ctx.causal, ctx.scale), None, None

    attention.register_autograd(backward, setup_context=setup_context)
    return attention


attention_forward = register("course::attention", attention_cpu.forward_kernel, attention_cpu.backward_kernel)


@torch.library.register_kernel("course::attention", "cuda")
def _(q, k, v, causal, scale):
    from course_lib.fused import attention_cuda  # numba.cuda is loaded only when a CUDA tensor comes

    return attention_cuda.forward(q, k, v, causal, scale)


@torch.library.register_kernel("course::attention_backward", "cuda")
def _(q, k, v, out, dout, lse, causal, scale):
    from course_lib.fused import attention_cuda

    return attention_cuda.backward(q, k, v, dout, lse, (dout * out).sum(-1), causal, scale)


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
