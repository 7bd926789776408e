"""Chapter 04's GPT, line for line, on course_lib.tensor instead of PyTorch.

The same pre-LayerNorm transformer as course_lib/gpt/model.py (nanoGPT's), with the same parameter
names (`transformer.h.0.attn.c_attn.weight`, ...), so a state dict of chapter 04's GPT loads as is.
Every op runs on the current backend of course_lib.tensor: numpy, or chapter 06's Numba kernels.

    model = GPT(GPTConfig(vocab_size=96), dtype=np.float64)
    model.load_state_dict(torch_gpt.state_dict())      # or GPT.from_torch(torch_gpt)
    logits, loss = model(idx, targets)                  # idx, targets: (B, T) integer arrays
"""

import math

import numpy as np
import torch

from course_lib.gpt.generate import sample
from course_lib.gpt.model import GPTConfig  # noqa: F401  (the same config as chapter 04)
from course_lib.tensor import Tensor, cross_entropy, generator, nn, no_grad


class CausalSelfAttention(nn.Module):
    def __init__(self, config, dtype):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, dtype=dtype)   # q, k, v for all heads at once
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, dtype=dtype)       # mixes the heads' outputs
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        # 1.0 above the diagonal: position i must not see j > i (a constant, not a parameter)
        self.future = Tensor(np.triu(np.ones((config.block_size, config.block_size)), k=1), dtype=dtype)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, H, T, d): each head sees its own d = C / H channels
        q, k, v = (t.reshape(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))         # (B, H, T, T)
        att = att.masked_fill(self.future[:T, :T], float("-inf"))
        att = self.attn_dropout(att.softmax(dim=-1))                             # each row sums to 1
        y = att @ v                                                              # (B, H, T, d)
        y = y.transpose(1, 2).contiguous().view(B, T, C)                         # heads side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config, dtype):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, dtype=dtype)
        self.gelu = nn.GELU(approximate="tanh")   # GPT-2's GELU, as chapter 04's
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, dtype=dtype)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """x + attn(ln_1(x)), then x + mlp(ln_2(x)): pre-norm, so the residual path stays clean."""

    def __init__(self, config, dtype, attention):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.attn = attention(config, dtype)
        self.ln_2 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.mlp = MLP(config, dtype)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    """attention: the class of every block's attention (a CausalSelfAttention, or a subclass of it)."""

    def __init__(self, config, dtype=np.float32, attention=CausalSelfAttention):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd, dtype=dtype),    # token embeddings
            wpe=nn.Embedding(config.block_size, config.n_embd, dtype=dtype),    # position embeddings
            drop=nn.Dropout(config.dropout),
            h=[Block(config, dtype, attention) for _ in range(config.n_layer)],
            ln_f=nn.LayerNorm(config.n_embd, dtype=dtype),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False, dtype=dtype)
        self.lm_head.weight = self.transformer.wte.weight   # tied: one matrix reads and writes tokens
        self._init_weights()

    def _init_weights(self):
        """GPT-2's init: N(0, 0.02) matrices, zero biases, and the projections into the residual
        stream scaled by 1/sqrt(number of residual adds)."""
        rng = generator()
        for name, p in self.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                continue                                   # LayerNorm gains stay 1
            std = 0.02 / math.sqrt(2 * self.config.n_layer) if name.endswith("c_proj.weight") else 0.02
            value = rng.normal(0.0, std, p.shape) if name.endswith("weight") else np.zeros(p.shape)
            p.copy_(Tensor(value, dtype=p.dtype))

    @classmethod
    def from_torch(cls, torch_gpt, dtype=None, attention=CausalSelfAttention):
        """A GPT holding the weights of chapter 04's PyTorch GPT (in its dtype unless `dtype` is given)."""
        sd = torch_gpt.state_dict()
        dtype = sd["lm_head.weight"].numpy().dtype if dtype is None else dtype
        model = cls(torch_gpt.config, dtype=dtype, attention=attention)
        model.load_state_dict({name: t.detach().cpu().numpy() for name, t in sd.items()})
        return model

    def num_params(self):
        """Parameters, counting the tied embedding once and leaving out position embeddings (as GPT-2 does)."""
        return sum(p.numel() for p in self.parameters()) - self.transformer.wpe.weight.numel()

    def forward(self, idx, targets=None):
        """Logits (B, T, vocab) for ids (B, T); the mean cross-entropy too when targets are given."""
        idx = np.asarray(idx, dtype=np.int64)
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} > block_size {self.config.block_size}")
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(np.arange(T)))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = cross_entropy(logits.reshape(B * T, -1), np.asarray(targets, dtype=np.int64).reshape(-1))
        return logits, loss

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        """Append max_new_tokens ids to idx (B, T) and return the (B, T + max_new_tokens) array: chapter 04's
        sampling loop (`course_lib.gpt.generate.sample`, temperature, top-k, draws from the torch.Generator
        `generator`) with no cache, so each step reruns the model on the context cropped to block_size."""
        self.eval()

        def forward(ids, cache):
            with no_grad():
                logits, _ = self(ids.numpy())
            return torch.tensor(logits.numpy())

        idx = torch.as_tensor(np.asarray(idx, dtype=np.int64))
        return sample(forward, idx, max_new_tokens, temperature, top_k, generator, self.config.block_size).numpy()
