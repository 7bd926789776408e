"""The fused selective scan as a PyTorch operator, with its own backward.

`torch.library.custom_op` (chapter 08) makes the Numba kernels an op that autograd, torch.compile
and export understand. Two ops:

    course::selective_scan(x, delta, A, B, C, D, chunk) -> (y, h_last, ckpt)
    course::selective_scan_backward(x, delta, A, B, C, D, ckpt, dy, dh_last, chunk) -> 6 gradients

The forward returns its checkpoints (the state every `chunk` steps, see scan_cpu.py) as a third
output because an op cannot hand data to its backward any other way: `setup_context` saves them
for the backward, which replays each chunk from them instead of storing all L states.
CPU tensors run the Numba CPU kernels; CUDA tensors the Numba CUDA ones (scan_cuda.py).

`selective_scan_fused` has the signature of chapter 05's scans, so `MambaConfig(scan="fused")` uses it.
"""

import torch

from course_lib.custom_ops.functions import as_numpy
from course_lib.fused import scan_cpu

Tensor = torch.Tensor
CHUNK = 64   # steps between checkpoints of the state: the backward replays chunks of this length


@torch.library.custom_op("course::selective_scan", mutates_args=(), device_types="cpu")
def selective_scan(x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor,
                   chunk: int) -> tuple[Tensor, Tensor, Tensor]:
    y, h_last, ckpt = _empty_outputs(x, A, chunk)
    scan_cpu.scan_forward(*map(as_numpy, (x, delta, A, B, C, D)), y.numpy(), h_last.numpy(), ckpt.numpy(), chunk)
    return y, h_last, ckpt


def _empty_outputs(x, A, chunk):
    (bsz, L, Dm), N = x.shape, A.shape[1]
    return x.new_empty(bsz, L, Dm), x.new_empty(bsz, Dm, N), x.new_empty(bsz, -(-L // chunk), Dm, N)


@selective_scan.register_fake
def _(x, delta, A, B, C, D, chunk):
    return _empty_outputs(x, A, chunk)


@selective_scan.register_kernel("cuda")
def _(x, delta, A, B, C, D, chunk):
    from course_lib.fused import scan_cuda  # only when a CUDA tensor arrives: it sets up numba.cuda

    return scan_cuda.scan_forward(*(t.contiguous() for t in (x, delta, A, B, C, D)), chunk)


@torch.library.custom_op("course::selective_scan_backward", mutates_args=(), device_types="cpu")
def selective_scan_backward(x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, ckpt: Tensor,
                            dy: Tensor, dh_last: Tensor, chunk: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of x, delta, A, B, C, D. dB and dC come in G parts (one per group of channels,
    see scan_cpu.scan_backward), dA and dD in one part per batch row: summed here."""
    (bsz, L, Dm), N = x.shape, A.shape[1]
    G = min(Dm, scan_cpu.GROUPS)
    dx, ddelta = x.new_empty(bsz, L, Dm), x.new_empty(bsz, L, Dm)
    dA, dD = x.new_empty(bsz, Dm, N), x.new_empty(bsz, Dm)
    dB, dC = x.new_zeros(bsz, G, L, N), x.new_zeros(bsz, G, L, N)
    scan_cpu.scan_backward(*map(as_numpy, (x, delta, A, B, C, D, ckpt, dy, dh_last)), chunk,
                           *(t.numpy() for t in (dx, ddelta, dA, dB, dC, dD)))
    return dx, ddelta, dA.sum(0), dB.sum(1), dC.sum(1), dD.sum(0)


@selective_scan_backward.register_fake
def _(x, delta, A, B, C, D, ckpt, dy, dh_last, chunk):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (x, delta, A, B, C, D))


@selective_scan_backward.register_kernel("cuda")
def _(x, delta, A, B, C, D, ckpt, dy, dh_last, chunk):
    from course_lib.fused import scan_cuda

    return scan_cuda.scan_backward(*(t.contiguous() for t in (x, delta, A, B, C, D, ckpt, dy, dh_last)), chunk)


def _setup_context(ctx, inputs, output):
    *tensors, chunk = inputs
    ctx.save_for_backward(*tensors, output[2])
    ctx.chunk = chunk
    ctx.mark_non_differentiable(output[2])


def _backward(ctx, dy, dh_last, _):
    x, delta, A, B, C, D, ckpt = ctx.saved_tensors
    dy = torch.zeros_like(x) if dy is None else dy                         # y or the state may be unused
    dh_last = x.new_zeros(x.shape[0], *A.shape) if dh_last is None else dh_last
    return *selective_scan_backward(x, delta, A, B, C, D, ckpt, dy, dh_last, ctx.chunk), None


selective_scan.register_autograd(_backward, setup_context=_setup_context)


def selective_scan_fused(x, delta, A, B, C, D, return_state=False, chunk=CHUNK):
    """Chapter 05's selective scan, fused: y (b, L, D), and the final state (b, D, N) if return_state."""
    args = [t.to(x.dtype) for t in (x, delta, A, B, C, D)]   # the kernels take one dtype
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in args)):
        chunk = max(x.shape[1], 1)    # no backward will run: one checkpoint (the zero state), not L / chunk
    y, h_last, _ = selective_scan(*args, chunk)
    return (y, h_last) if return_state else y
