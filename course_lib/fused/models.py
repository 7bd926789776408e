"""Chapter 10's kernels in chapter 04's GPT and chapter 05's Mamba, through the plug-in points they declare.

    from course_lib.fused import models
    with models.running():            # GPTConfig(fused=True) and MambaConfig(scan="fused") run these kernels
        logits, loss = gpt(idx, targets)
        loss.backward()

The two models name no kernel of this chapter. Each declares a context manager that installs a fused
kernel for the block: `gpt.model.attention_kernel(fn)` and `mamba.scan.scan_kernel(fn)`. `running()`
installs the course's pair; course_lib.yours.fused installs the learner's the same way.
"""

import contextlib

from course_lib.fused.attention_op import attention
from course_lib.fused.scan_op import selective_scan_fused
from course_lib.gpt.model import attention_kernel
from course_lib.mamba.scan import scan_kernel


def causal_attention(q, k, v):
    """The GPT's fused attention: causal, the Tq queries lined up with the last Tq of the Tk keys."""
    return attention(q, k, v, causal=True)


@contextlib.contextmanager
def running():
    """Inside the block, GPTConfig(fused=True) runs `causal_attention` and MambaConfig(scan="fused") the fused scan."""
    with scan_kernel(selective_scan_fused), attention_kernel(causal_attention):
        yield
