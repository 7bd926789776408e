"""Chapter 12, the capstone: chapter 04's GPT again, this time on the course's own tensor library.

- `model`  GPT, written against course_lib.tensor with chapter 04's parameter names, so its
           state dict loads; runs on any backend (`course_lib.tensor.use_backend("numba")`)
- `train`  chapter 04's training loop (AdamW, warmup + cosine, clipping) for it, and a side-by-side
           run against chapter 04's PyTorch GPT from the same weights on the same batches
"""

from course_lib.capstone.model import GPT, GPTConfig  # noqa: F401
from course_lib.capstone.train import (  # noqa: F401
    COURSE,
    compare_training,
    configure_optimizer,
    estimate_loss,
    train,
    train_step,
)
