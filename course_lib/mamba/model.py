"""Mamba: the selective SSM block and a language model built from it.

Parameter names and shapes follow Hugging Face transformers' Mamba (`backbone.layers.0.mixer.in_proj.weight`,
...), so `model.load_state_dict(hf_model.state_dict())` works in both directions.

    model = Mamba(MambaConfig(vocab_size=96, d_model=64, n_layer=2))
    logits, loss = model(idx, targets)        # idx, targets: (B, T) token ids

The block, for an input u (B, T, d_model), with D = expand * d_model inner channels:

    x, z = in_proj(u)                         two (B, T, D) halves: the signal and the gate
    x = silu(causal_depthwise_conv1d(x))      mixes each channel with its last d_conv - 1 inputs
    dt, B, C = x_proj(x)                      input-dependent: this is the "selective" part
    delta = softplus(dt_proj(dt))             a positive step size per channel and position
    y = selective_scan(x, delta, A, B, C, D)  A = -exp(A_log): negative, so the state decays
    out = out_proj(y * silu(z))
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.mamba.scan import SCANS


@dataclass
class MambaConfig:
    vocab_size: int = 96
    d_model: int = 64
    n_layer: int = 2
    d_state: int = 16          # N, the size of each channel's state
    expand: int = 2            # inner channels D = expand * d_model
    d_conv: int = 4            # the causal conv's kernel size
    dt_rank: int = 0           # the rank of the Δ projection; 0 means ceil(d_model / 16)
    eps: float = 1e-5          # RMSNorm epsilon
    scan: str = "parallel"     # which selective scan the full-sequence forward uses (see scan.SCANS)
    selective: bool = True     # False: Δ, B, C are learned constants, the same at every position (time-invariant)

    def __post_init__(self):
        self.d_inner = self.expand * self.d_model
        self.dt_rank = self.dt_rank or math.ceil(self.d_model / 16)

    def hf_kwargs(self):
        """The keyword arguments of the equivalent `transformers.MambaConfig`."""
        return dict(vocab_size=self.vocab_size, hidden_size=self.d_model, num_hidden_layers=self.n_layer,
                    state_size=self.d_state, expand=self.expand, conv_kernel=self.d_conv,
                    time_step_rank=self.dt_rank, layer_norm_epsilon=self.eps, use_bias=False,
                    use_conv_bias=True, tie_word_embeddings=True)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight: LayerNorm without the mean subtraction and the bias."""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def causal_conv1d(x, weight, bias):
    """The course's answer to exercise 05.5 (`causal_conv1d`): read it once your check passes.

    Depthwise conv over time that sees only the past. x: (B, D, T); weight: (D, K); bias: (D,).

    Padding K-1 zeros on the left makes output t depend on inputs t-K+1 .. t and nothing later.
    """
    K = weight.shape[-1]
    return F.conv1d(F.pad(x, (K - 1, 0)), weight[:, None, :], bias, groups=x.shape[1])


class MambaBlock(nn.Module):
    """The Mamba mixer (Hugging Face calls it MambaMixer): in_proj, conv, selective scan, gate, out_proj."""

    def __init__(self, config):
        super().__init__()
        D, N, R = config.d_inner, config.d_state, config.dt_rank
        self.config = config
        self.in_proj = nn.Linear(config.d_model, 2 * D, bias=False)
        self.conv1d = nn.Conv1d(D, D, config.d_conv, groups=D, padding=config.d_conv - 1)   # weight (D, 1, K)
        if config.selective:
            self.x_proj = nn.Linear(D, R + 2 * N, bias=False)
            self.dt_proj = nn.Linear(R, D, bias=True)
            dt_bias = self.dt_proj.bias
        else:   # time-invariant, like S4: one Δ per channel, one B and one C, whatever the input
            self.dt_bias = nn.Parameter(torch.empty(D))
            self.B = nn.Parameter(torch.ones(N))
            self.C = nn.Parameter(torch.randn(N) / math.sqrt(N))
            dt_bias = self.dt_bias
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1, dtype=torch.float32)).repeat(D, 1))
        self.D = nn.Parameter(torch.ones(D))
        self.out_proj = nn.Linear(D, config.d_model, bias=False)
        with torch.no_grad():   # Δ starts log-uniform in [0.001, 0.1]: bias = softplus^-1(Δ)
            dt = torch.exp(torch.rand(D) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            if config.selective:
                nn.init.uniform_(self.dt_proj.weight, -R ** -0.5, R ** -0.5)

    def ssm_params(self, x):
        """Δ (softplus of dt_proj), B and C from the conv output x (..., D)."""
        N, R = self.config.d_state, self.config.dt_rank
        if not self.config.selective:   # the same three at every position: x is not looked at
            shape = x.shape[:-1]
            return F.softplus(self.dt_bias).expand(*shape, -1), self.B.expand(*shape, N), self.C.expand(*shape, N)
        dt, B, C = self.x_proj(x).split([R, N, N], dim=-1)
        return F.softplus(self.dt_proj(dt)), B, C

    def forward(self, u, state=None):
        """The course's answer to exercise 05.6 (`block_forward`): read it once your check passes.

        u: (B, T, d_model) -> (B, T, d_model). If `state` is an empty dict, the final conv and
        SSM states are stored in it, ready for `step`."""
        T = u.shape[1]
        x, z = self.in_proj(u).chunk(2, dim=-1)                                  # (B, T, D) each
        x_t = x.transpose(1, 2)                                                  # (B, D, T)
        x = F.silu(causal_conv1d(x_t, self.conv1d.weight[:, 0], self.conv1d.bias)).transpose(1, 2)
        delta, B, C = self.ssm_params(x)
        A = -torch.exp(self.A_log)
        scan = SCANS[self.config.scan]
        if state is None:
            y = scan(x, delta, A, B, C, self.D)
        else:
            y, state["ssm"] = scan(x, delta, A, B, C, self.D, return_state=True)
            K = self.config.d_conv
            state["conv"] = F.pad(x_t, (max(K - 1 - T, 0), 0))[:, :, -(K - 1):]   # the last K-1 inputs
        return self.out_proj(y * F.silu(z))

    def step(self, u, state):
        """The course's answer to exercise 05.7 (`mamba_step`): read it once your check passes.

        One position: u (B, d_model) -> (B, d_model), updating state {"conv": (B, D, K-1), "ssm": (B, D, N)}.

        The cost and the memory of a step do not grow with the number of positions already seen.
        """
        x, z = self.in_proj(u).chunk(2, dim=-1)                                  # (B, D) each
        window = torch.cat([state["conv"], x[:, :, None]], dim=-1)               # (B, D, K)
        state["conv"] = window[:, :, 1:]
        x = F.silu((window * self.conv1d.weight[:, 0]).sum(-1) + self.conv1d.bias)
        delta, B, C = self.ssm_params(x)
        A = -torch.exp(self.A_log)
        h = torch.exp(delta[..., None] * A) * state["ssm"] + delta[..., None] * B[:, None, :] * x[..., None]
        state["ssm"] = h
        y = (h * C[:, None, :]).sum(-1) + self.D * x
        return self.out_proj(y * F.silu(z))


class ResidualBlock(nn.Module):
    """u + MambaBlock(RMSNorm(u)): Hugging Face's MambaBlock, holding `norm` and `mixer`."""

    def __init__(self, config):
        super().__init__()
        self.norm = RMSNorm(config.d_model, config.eps)
        self.mixer = MambaBlock(config)

    def forward(self, u, state=None):
        return u + self.mixer(self.norm(u), state)

    def step(self, u, state):
        return u + self.mixer.step(self.norm(u), state)


class Mamba(nn.Module):
    """The language model: embedding, residual Mamba blocks, a final RMSNorm, a tied LM head.

    No position embeddings: the recurrence itself knows the order, so any length runs.
    """

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.backbone = nn.ModuleDict(dict(
            embeddings=nn.Embedding(config.vocab_size, config.d_model),
            layers=nn.ModuleList([ResidualBlock(config) for _ in range(config.n_layer)]),
            norm_f=RMSNorm(config.d_model, config.eps),
        ))
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.backbone.embeddings.weight     # tied
        nn.init.normal_(self.backbone.embeddings.weight, std=0.02)
        for layer in self.backbone.layers:   # keep the residual stream's variance from growing with depth
            with torch.no_grad():
                layer.mixer.out_proj.weight /= math.sqrt(config.n_layer)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets=None, cache=None):
        """Logits (B, T, vocab) for ids (B, T), and the mean cross-entropy when targets are given.

        cache: a `MambaCache`. Empty, the sequence runs in full and the cache keeps the final states;
        filled, the new ids run one step at a time from those states.
        """
        x = self.backbone.embeddings(idx)
        if cache is not None and cache.filled:
            outs = []
            for t in range(idx.shape[1]):
                h = x[:, t]
                for layer, state in zip(self.backbone.layers, cache.layers):
                    h = layer.step(h, state)
                outs.append(h)
            x = torch.stack(outs, dim=1)
        else:
            for i, layer in enumerate(self.backbone.layers):
                x = layer(x, None if cache is None else cache.layers[i])
        if cache is not None:
            cache.seen += idx.shape[1]
        logits = self.lm_head(self.backbone.norm_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


class MambaCache:
    """The fixed-size state of a Mamba LM: per layer the last d_conv-1 conv inputs and the SSM state.

    Its size, n_layer * B * D * (d_conv - 1 + d_state) numbers, does not depend on the sequence length.
    """

    def __init__(self, n_layer):
        self.layers = [{} for _ in range(n_layer)]
        self.seen = 0

    @property
    def filled(self):
        return self.seen > 0

    def nbytes(self):
        return sum(t.numel() * t.element_size() for layer in self.layers for t in layer.values())
