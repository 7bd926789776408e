"""Chapter 10 assembled from your kernels: chapter 05's Mamba on your scan, chapter 04's GPT on your attention.

    from course_lib.yours import fused
    kernels = fused.assemble()                  # one line says whose kernels run
    with kernels.running():                     # MambaConfig(scan="fused") and GPTConfig(fused=True) use them
        logits, loss = gpt(idx, targets)
        loss.backward()

What runs where:
    the Mamba's selective scan, forward     your fused_scan (chapter 10)
    the Mamba's selective scan, backward    the course's backward kernel, replaying your checkpoints
    the GPT's attention, forward            your flash_forward, inside your op (register_flash_attention)
    the GPT's attention, backward           your flash_backward, inside the same op
The models take them through their declared plug-in points, `mamba.scan.scan_kernel` and
`gpt.model.attention_kernel`. A kernel you have not saved (or turned off with `yours.use("10", False)`)
is the course's own answer to that exercise, found through course_lib/answer_key.py: the pieces share
its signatures.
"""

import contextlib
import importlib
import itertools

import torch

from course_lib import answer_key, yours
from course_lib.custom_ops.functions import as_numpy
from course_lib.fused.scan_op import CHUNK, selective_scan_backward
from course_lib.gpt.model import attention_kernel
from course_lib.mamba.scan import scan_kernel

# the pieces the exercises save, and the check that passes each (register_flash_attention's is attention_op)
CHECKS = {"fused_scan": "fused_scan", "flash_forward": "flash_forward", "flash_backward": "flash_backward",
          "register_flash_attention": "attention_op"}


def course_piece(check):
    """The course's answer to chapter 10's exercise `check`, from the answer key's "module:qualname" (the
    first of a tuple: the definition with the exercise's signature)."""
    entry = answer_key.CH10[check]
    module, qualname = (entry if isinstance(entry, str) else entry[0]).split(":")
    return getattr(importlib.import_module(module), qualname)


COURSE = {piece: course_piece(check) for piece, check in CHECKS.items()}

_names = itertools.count()   # an op name is taken for good once registered: a fresh one per assembly


class _Scan(torch.autograd.Function):
    """Your forward kernel, and the course's backward kernel fed with the checkpoints yours saved."""

    @staticmethod
    def forward(ctx, x, delta, A, B, C, D, kernel, chunk):
        (bsz, L, Dm), N = x.shape, A.shape[1]
        y, h_last, ckpt = x.new_empty(bsz, L, Dm), x.new_empty(bsz, Dm, N), x.new_empty(bsz, -(-L // chunk), Dm, N)
        kernel(*map(as_numpy, (x, delta, A, B, C, D)), y.numpy(), h_last.numpy(), ckpt.numpy(), chunk)
        ctx.save_for_backward(x, delta, A, B, C, D, ckpt)
        ctx.chunk = chunk
        return y, h_last

    @staticmethod
    def backward(ctx, dy, dh_last):
        x, delta, A, B, C, D, ckpt = ctx.saved_tensors
        dy = torch.zeros_like(x) if dy is None else dy.contiguous()
        dh_last = x.new_zeros(x.shape[0], *A.shape) if dh_last is None else dh_last.contiguous()
        return *selective_scan_backward(x, delta, A, B, C, D, ckpt, dy, dh_last, ctx.chunk), None, None


class Kernels:
    """Your chapter 10 kernels (pieces: the course's where yours are not saved) as the models' two fused
    kernels, and the block that plugs them in."""

    def __init__(self, pieces):
        self.pieces = pieces
        self.op = pieces["register_flash_attention"](f"yours::flash_attention_{next(_names)}",
                                                     pieces["flash_forward"], pieces["flash_backward"])

    def scan(self, x, delta, A, B, C, D, return_state=False):
        """Chapter 05's selective scan signature, on your fused_scan."""
        args = (t.to(x.dtype).contiguous() for t in (x, delta, A, B, C, D))
        y, h_last = _Scan.apply(*args, self.pieces["fused_scan"], CHUNK)
        return (y, h_last) if return_state else y

    def attention(self, q, k, v):
        """Causal attention, queries aligned with the last keys, on your op: (B, H, Tq, d) -> (B, H, Tq, dv)."""
        return self.op(q, k, v, True, q.shape[-1] ** -0.5)[0]

    @contextlib.contextmanager
    def running(self):
        """Inside the block, MambaConfig(scan="fused") runs `scan` and GPTConfig(fused=True) runs `attention`."""
        with scan_kernel(self.scan), attention_kernel(self.attention):
            yield


def assemble(quiet=False):
    """Your chapter 10 kernels (the course's where yours are not saved) as the models' two fused kernels."""
    return Kernels(yours.pieces("10", reference=COURSE, quiet=quiet))
