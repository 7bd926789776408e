"""Chapter 04: a GPT from scratch, with its tokenizers, sampling, a KV cache and a training loop.

- `tokenizers`  CharTokenizer and a byte-level BPE trained from scratch
- `model`       GPTConfig and GPT, with Hugging Face GPT-2 parameter names
- `generate`    temperature and top-k sampling, with and without a KV cache
- `data`        make_get_batch: random (x, y) windows from a 1-D tensor of ids
- `schedule`    lr_at: the learning rate of each step, a warmup then a cosine
- `trainer`     TrainConfig, AdamW, clipping, evaluation, checkpoints, the loop

tokenizers, model, generate and trainer hold the course's answers to chapter 04's exercises, each
marked with the exercise it answers: read them once your checks pass. schedule.py's lr_at is the
course's answer to exercise 12.10, which writes it again: read it once that check passes. The names
below are the chapter's library, to use before then.
"""

from course_lib.gpt.data import make_get_batch, split_tokens
from course_lib.gpt.generate import generate, sample_next, top_k_filter
from course_lib.gpt.model import GPT, Block, CausalSelfAttention, GPTConfig, KVCache, causal_attention
from course_lib.gpt.schedule import lr_at
from course_lib.gpt.tokenizers import SPLIT, BPETokenizer, CharTokenizer
from course_lib.gpt.trainer import (
                                    TrainConfig,
                                    configure_optimizer,
                                    estimate_loss,
                                    load_checkpoint,
                                    save_checkpoint,
                                    train,
                                    train_step,
)
