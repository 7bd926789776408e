"""The course's answers to exercises 12.7 (`block`) and 12.8 (`gpt`): read them once your checks pass.

Chapter 04's GPT on course_lib.tensor, with chapter 04's parameter names (`transformer.h.0.attn.c_attn.weight`,
...), so a state dict of chapter 04's PyTorch GPT loads as it is. The layers are the library's (`nn.Linear`,
`nn.LayerNorm`, `nn.Embedding`); their ops, and the GELU, come from the op registry, so the fused Functions
of functions.py run them (`fused_ops()`, unless a use_ops block outside put others in); attention applies
functions.CausalAttention.

    model = GPT(GPTConfig(vocab_size=96), dtype=np.float64)
    model.load_state_dict(torch_gpt.state_dict())      # or GPT.from_torch(torch_gpt)
    logits, loss = model(idx, targets)                  # idx, targets: (B, T) integer arrays
"""

import math

import numpy as np

from course_lib.capstone.functions import CausalAttention, fused_ops
from course_lib.tensor import Tensor, cross_entropy, generator, nn


class MLP(nn.Module):
    """The course's answer to exercise 12.7 (`block`): read it once your check passes.

    c_fc to 4C, GPT-2's GELU, c_proj back to C."""

    def __init__(self, config, dtype):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, dtype=dtype)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, dtype=dtype)

    def forward(self, x):
        return self.c_proj(self.c_fc(x).gelu("tanh"))


class CausalSelfAttention(nn.Module):
    """The course's answer to exercise 12.7 (`block`): read it once your check passes.

    One Linear makes q, k and v of every head; each head attends with CausalAttention on its own
    C / n_head channels; the heads sit side by side again and c_proj mixes them."""

    def __init__(self, config, dtype):
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError(f"n_embd = {config.n_embd} does not split into n_head = {config.n_head} heads "
                             "of equal width")
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, dtype=dtype)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, dtype=dtype)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.reshape(B, T, self.n_head, C // self.n_head).transpose(1, 2)    # (B, H, T, d) each
                   for t in self.c_attn(x).split(C, dim=2))
        y = CausalAttention.apply(q, k, v).transpose(1, 2).reshape(B, T, C)       # heads side by side
        return self.c_proj(y)


class Block(nn.Module):
    """The course's answer to exercise 12.7 (`block`): read it once your check passes.

    Pre-norm: each sublayer reads a normalised copy of x, and its output is added to x itself, so the
    residual path from the first block to the last is a chain of additions."""

    def __init__(self, config, dtype):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.attn = CausalSelfAttention(config, dtype)
        self.ln_2 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.mlp = MLP(config, dtype)

    def forward(self, x):
        for norm, sublayer in ((self.ln_1, self.attn), (self.ln_2, self.mlp)):
            x = x + sublayer(norm(x))
        return x


class GPT(nn.Module):
    """The course's answer to exercise 12.8 (`gpt`): read it once your check passes.

    Token and position embeddings, the blocks, a final layer norm, and a head that is the token
    embedding itself (tied). Weights as chapter 04 draws them: N(0, 0.02), the projections into the
    residual stream N(0, 0.02 / sqrt(2 n_layer)), zero biases, layer norms 1 and 0."""

    def __init__(self, config, dtype=np.float32):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd, dtype=dtype),
            wpe=nn.Embedding(config.block_size, config.n_embd, dtype=dtype),
            h=[Block(config, dtype) for _ in range(config.n_layer)],
            ln_f=nn.LayerNorm(config.n_embd, dtype=dtype),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False, dtype=dtype)
        self.lm_head.weight = self.transformer.wte.weight      # one matrix reads and writes tokens
        residual_std = 0.02 / math.sqrt(2 * config.n_layer)
        for name, p in self.named_parameters():      # the tied matrix comes once
            if p.ndim == 2:
                std = residual_std if name.endswith("c_proj.weight") else 0.02
                p.copy_(Tensor(generator().normal(0.0, std, p.shape), dtype=p.dtype))
            elif name.endswith(".bias"):
                p.copy_(Tensor(np.zeros(p.shape), dtype=p.dtype))

    @classmethod
    def from_torch(cls, torch_gpt, dtype=None):
        """A GPT holding the weights of chapter 04's PyTorch GPT (in its dtype unless `dtype` is given)."""
        return from_torch(cls, torch_gpt, dtype)

    def forward(self, idx, targets=None):
        """Logits (B, T, vocab) for ids (B, T); the mean cross-entropy too when targets are given."""
        idx = np.asarray(idx, dtype=np.int64)
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"a sequence of {T} tokens is longer than block_size = {self.config.block_size}")
        with fused_ops():   # the course's Functions, where no use_ops block outside put others in
            x = self.transformer.wte(idx) + self.transformer.wpe(np.arange(T))
            for block in self.transformer.h:
                x = block(x)
            logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits, None
        return logits, cross_entropy(logits.reshape(B * T, -1), np.asarray(targets, dtype=np.int64).reshape(-1))


def from_torch(GPT, torch_gpt, dtype=None):
    """A `GPT` (any class with chapter 04's parameter names, built as GPT(config, dtype)) holding the
    weights of chapter 04's PyTorch GPT, in its dtype unless `dtype` is given."""
    sd = torch_gpt.state_dict()
    dtype = sd["lm_head.weight"].numpy().dtype if dtype is None else dtype
    model = GPT(torch_gpt.config, dtype)
    model.load_state_dict({name: t.detach().cpu().numpy() for name, t in sd.items()})
    return model
