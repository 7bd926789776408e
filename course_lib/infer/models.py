"""The models this chapter exports to ONNX: an MLP, a small CNN, and the course's GPT.

`course_gpt` builds chapter 04's GPT (with its written-out attention, sdpa=False, which the
legacy exporter handles) when `course_lib.gpt` provides one that exports, and
otherwise the small decoder-only transformer below (same architecture family: token and
position embeddings, pre-LayerNorm blocks of causal self-attention and a GELU MLP).
"""

import io
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, n_in=64, hidden=(128, 64), n_out=10):
        super().__init__()
        sizes = (n_in, *hidden)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.head = nn.Linear(sizes[-1], n_out)

    def forward(self, x):
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)


class SmallCNN(nn.Module):
    """Two conv-relu-pool stages and a linear head, for 1x16x16 images."""
    def __init__(self, channels=(8, 16), n_out=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels[0], 3, padding=1)
        self.conv2 = nn.Conv2d(channels[0], channels[1], 3, padding=1)
        self.head = nn.Linear(channels[1] * 4 * 4, n_out)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(torch.flatten(x, 1))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.n_head)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    """A small GPT (forward(idx) -> logits), used when chapter 04's GPT is not available."""
    def __init__(self, vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64):
        super().__init__()
        self.block_size = block_size
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class LogitsOnly(nn.Module):
    """Wrap a model whose forward returns (logits, loss) so the exported graph has one output."""
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx):
        out = self.model(idx)
        return out[0] if isinstance(out, tuple) else out


def course_gpt(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64, seed=0):
    """(model, where it came from): chapter 04's GPT if importable and exportable, else TinyGPT."""
    torch.manual_seed(seed)
    try:
        import dataclasses

        from course_lib.gpt.model import GPT, GPTConfig
        extra = {"sdpa": False} if "sdpa" in {f.name for f in dataclasses.fields(GPTConfig)} else {}
        # the written-out attention exports; F.scaled_dot_product_attention's is_causal does not (legacy exporter)
        cfg = GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                        **extra)
        model = LogitsOnly(GPT(cfg)).eval()
        export(model, torch.zeros(1, 8, dtype=torch.long), ["idx"], ["logits"], {"idx": {0: "batch", 1: "time"}})
        return model, "course_lib.gpt.GPT (chapter 04)"
    except Exception:
        torch.manual_seed(seed)
        return TinyGPT(vocab_size, block_size, n_layer, n_head, n_embd).eval(), "TinyGPT (this chapter's stand-in)"


def export(model, example, input_names, output_names, dynamic_axes=None, opset=17):
    """torch.onnx.export with the legacy TorchScript exporter (dynamo=False): it needs only onnx."""
    import warnings

    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (example,), buf, input_names=input_names, output_names=output_names,
                          dynamic_axes=dynamic_axes, opset_version=opset, dynamo=False)
    return buf.getvalue()
