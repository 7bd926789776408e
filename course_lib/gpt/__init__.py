"""Chapter 04: a GPT from scratch, with its tokenizers, sampling, a KV cache and a training loop.

- `tokenizers`  CharTokenizer and a byte-level BPE trained from scratch
- `model`       GPTConfig and GPT, with Hugging Face GPT-2 parameter names
- `generate`    temperature and top-k sampling, with and without a KV cache
- `data`        make_get_batch: random (x, y) windows from a 1-D tensor of ids
- `trainer`     TrainConfig, AdamW, warmup + cosine, clipping, evaluation, checkpoints
"""

from course_lib.gpt.data import make_get_batch, split_tokens
from course_lib.gpt.trainer import (
                                    TrainConfig,
                                    configure_optimizer,
                                    estimate_loss,
                                    load_checkpoint,
                                    lr_at,
                                    save_checkpoint,
                                    train,
                                    train_step,
)
