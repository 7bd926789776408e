"""A GPT in one file: embeddings, a stack of pre-LayerNorm transformer blocks, a tied LM head.

Parameter names and shapes follow Hugging Face's GPT-2 (`transformer.h.0.attn.c_attn.weight`, ...),
except that our linear layers store (out, in) where GPT-2's Conv1D stores (in, out):
`GPT.from_hf_state_dict` transposes those four matrices, and a GPT-2 state dict loads.

    model = GPT(GPTConfig(vocab_size=96, block_size=64, n_layer=4, n_head=4, n_embd=128))
    logits, loss = model(idx, targets)        # idx, targets: (B, T) token ids

GPTConfig(bias=False, gelu="none") is nanoGPT's variant of the same model (no biases in the linear
layers and LayerNorms, the exact GELU): the benchmarks compare the two on equal terms with it.
"""

import contextlib
import contextvars
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 96
    block_size: int = 64       # the longest context, the number of learned positions
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True          # biases in the linear layers and LayerNorms (GPT-2); False as nanoGPT trains
    gelu: str = "tanh"         # F.gelu's `approximate`: GPT-2's tanh form; "none" is the exact GELU (nanoGPT)
    sdpa: bool = True          # use F.scaled_dot_product_attention; False runs `causal_attention` below
    fused: bool = False        # the fused kernel installed with `attention_kernel` (chapter 10 writes one); no dropout


def causal_attention(q, k, v, dropout=None):
    """The course's answer to exercise 04.3 (`attention_head`): read it once your check passes.

    softmax(q k^T / sqrt(d) + causal mask) v, written out. q: (B, H, Tq, d); k, v: (B, H, Tk, d).

    The Tq queries are the last Tq of the Tk positions (Tq < Tk when earlier keys come from a
    KV cache): query i may look at key j only when j <= i + (Tk - Tq). Returns (output, weights).
    """
    Tq, Tk = q.size(-2), k.size(-2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))                  # (B, H, Tq, Tk)
    allowed = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(diagonal=Tk - Tq)
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = F.softmax(scores, dim=-1)                                      # each row sums to 1
    out = (dropout(weights) if dropout is not None else weights) @ v          # (B, H, Tq, d)
    return out, weights


# ---- the attention kernels: one is chosen per model, when it is built --------------------------
# Each takes q (B, H, Tq, d), k and v (B, H, Tk, d), the Tq queries being the last Tq of the Tk
# positions (Tq < Tk with a KV cache), and the dropout probability; it returns (B, H, Tq, d).

def sdpa_attention(q, k, v, dropout_p):
    """PyTorch's fused kernel. Its is_causal mask assumes Tq == Tk, so a cache needs an explicit mask."""
    Tq, Tk = q.size(-2), k.size(-2)
    mask = None if Tq == Tk else torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and Tq > 1,
                                          dropout_p=dropout_p)


def written_out_attention(q, k, v, dropout_p):
    """`causal_attention` above, step by step; the weights it also returns are dropped."""
    drop = (lambda w: F.dropout(w, dropout_p)) if dropout_p > 0 else None
    return causal_attention(q, k, v, drop)[0]


_kernel = contextvars.ContextVar("attention_kernel", default=None)


@contextlib.contextmanager
def attention_kernel(fn):
    """Inside this block, models with GPTConfig(fused=True) compute attention as fn(q, k, v) -> y: causal,
    with the Tq queries lined up with the last Tq of the Tk keys (a KV cache), q (B, H, Tq, d).
    The plug-in point for a fused kernel: this chapter has none of its own, chapter 10 writes one."""
    token = _kernel.set(fn)
    try:
        yield fn
    finally:
        _kernel.reset(token)


def fused_attention(q, k, v, dropout_p):
    """The fused kernel that `attention_kernel` installed. Its mask lines the Tq queries up with the last Tq keys."""
    if dropout_p > 0:
        raise NotImplementedError("the fused attention has no dropout")
    fn = _kernel.get()
    if fn is None:
        raise RuntimeError("GPTConfig(fused=True) runs the fused attention kernel installed by "
                           "`with attention_kernel(fn):`, and none is installed here: run the model inside "
                           "such a block (chapter 10 writes the kernel, and installs it that way)")
    return fn(q, k, v)


def choose_attention(config):
    """The kernel a model built from `config` uses, for its whole life."""
    return fused_attention if config.fused else sdpa_attention if config.sdpa else written_out_attention


class CausalSelfAttention(nn.Module):
    """The course's answer to exercise 04.4 (`split_merge_heads`): read it once your check passes.

    H heads of causal self-attention: c_attn makes q, k, v for all heads at once, each head works on
    its own d = C / H channels, and c_proj mixes the heads' outputs, laid side by side."""

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.attend = choose_attention(config)   # chosen once, here, not on every call
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)   # q, k, v of all heads
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)       # mixes the heads
        self.resid_dropout = nn.Dropout(config.dropout)

    def heads(self, x, cache=None, layer=0):
        """q, k, v for x (B, T, C), each (B, H, T, d): views of c_attn's output, no copies. With a
        cache, k and v also hold the earlier positions (B, H, Tk, d)."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, H, T, d): each head sees its own d = C / H channels
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = cache.update(layer, k, v)   # prepend the keys and values of earlier positions
        return q, k, v

    def forward(self, x, cache=None, layer=0):
        B, T, C = x.shape
        y = self.attend(*self.heads(x, cache, layer), self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)   # (B, H, T, d) -> (B, T, C): heads side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.gelu = config.gelu
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate=self.gelu)))


class Block(nn.Module):
    """The course's answer to exercise 04.5 (`block_forward`): read it once your check passes.

    x + attn(ln_1(x)), then x + mlp(ln_2(x)): pre-norm, so the residual path stays clean."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, cache=None, layer=0):
        x = x + self.attn(self.ln_1(x), cache, layer)
        x = x + self.mlp(self.ln_2(x))
        return x


class KVCache:
    """The course's answer to exercise 04.9 (`decode_step`): read it once your check passes.

    The keys and values of the positions seen so far, one (k, v) pair of (B, H, T, d) per layer;
    GPT.forward, given one, runs only the new positions."""

    def __init__(self, n_layer):
        self.layers = [None] * n_layer

    def __len__(self):
        return 0 if self.layers[0] is None else self.layers[0][0].size(2)

    def update(self, layer, k, v):
        """Append this step's k, v (along time) and return all keys and values so far."""
        if self.layers[layer] is not None:
            past_k, past_v = self.layers[layer]
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        self.layers[layer] = (k, v)
        return k, v


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),    # token embeddings
            wpe=nn.Embedding(config.block_size, config.n_embd),    # position embeddings
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight   # tied: one matrix reads and writes tokens
        self.apply(self._init_weights)
        # GPT-2: scale the projections into the residual stream by 1/sqrt(number of residual adds)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self):
        """Parameters, counting the tied embedding once and leaving out position embeddings (as GPT-2 does)."""
        return sum(p.numel() for p in self.parameters()) - self.transformer.wpe.weight.numel()

    def forward(self, idx, targets=None, cache=None):
        """The course's answer to exercise 04.6 (`gpt_forward`): read it once your check passes.

        Logits (B, T, vocab) for ids (B, T); the mean cross-entropy too when targets are given.

        With a KVCache, idx holds only the new positions; the cache supplies (and then keeps) the rest.
        """
        B, T = idx.shape
        start = len(cache) if cache is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of length {start + T} > block_size {self.config.block_size}")
        pos = torch.arange(start, start + T, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for layer, block in enumerate(self.transformer.h):
            x = block(x, cache, layer)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    @torch.no_grad()
    def attention_maps(self, idx):
        """The attention weights of every layer for ids (B, T): a list of (B, H, T, T) tensors.

        The forward pass never keeps them; this walks the blocks itself and asks `causal_attention`
        for the weights of each layer's q and k."""
        B, T = idx.shape
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(T, device=idx.device))
        maps = []
        for block in self.transformer.h:
            q, k, v = block.attn.heads(block.ln_1(x))
            maps.append(causal_attention(q, k, v)[1])
            x = block(x)
        return maps

    # ---- Hugging Face GPT-2 weights ---------------------------------------------------------

    CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")

    @classmethod
    def from_hf_state_dict(cls, sd, config):
        """A GPT holding the weights of a Hugging Face GPT2LMHeadModel state dict.

        GPT-2's Conv1D keeps its weight as (in, out); nn.Linear keeps (out, in), so those transpose.
        Buffers that are not weights (the old attention masks `attn.bias`, `attn.masked_bias`) are skipped.
        """
        model = cls(config)
        ours = model.state_dict()
        for name, tensor in sd.items():
            if name.endswith((".attn.bias", ".attn.masked_bias")):   # (not c_attn.bias!)
                continue
            if name not in ours:
                raise KeyError(f"unexpected parameter {name}")
            t = tensor.t() if name.endswith(cls.CONV1D) else tensor
            if t.shape != ours[name].shape:
                raise ValueError(f"{name}: shape {tuple(t.shape)}, expected {tuple(ours[name].shape)}")
            with torch.no_grad():
                ours[name].copy_(t)
        return model

    def to_hf_state_dict(self):
        """Our weights with the names and (Conv1D) shapes of a Hugging Face GPT2LMHeadModel."""
        return {name: (t.t() if name.endswith(self.CONV1D) else t).contiguous()
                for name, t in self.state_dict().items()}
