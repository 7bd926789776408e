"""Modules: objects that own parameters and map tensors to tensors, as in torch.nn."""

from __future__ import annotations

import math

import numpy as np

from course_lib.tensor.tensor import Tensor, generator, one_hot
from course_lib.tensor.tensor_data import ShapeError


class Parameter(Tensor):
    """A tensor that a Module trains: requires_grad is on, and Module.parameters() finds it."""

    def __init__(self, data, dtype=None):
        super().__init__(data, requires_grad=True, dtype=dtype)


class Module:
    """Base class. Assign Parameters and sub-Modules as attributes; write forward()."""

    def __init__(self):
        self.training = True

    def forward(self, *args):
        raise NotImplementedError

    def __call__(self, *args):
        return self.forward(*args)

    def named_children(self):
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, Module):
                        yield f"{name}.{i}", item

    def named_parameters(self, prefix: str = ""):
        for name, value in vars(self).items():
            if isinstance(value, Parameter):
                yield prefix + name, value
        for name, child in self.named_children():
            yield from child.named_parameters(f"{prefix}{name}.")

    def parameters(self) -> list:
        return [p for _, p in self.named_parameters()]

    def modules(self):
        yield self
        for _, child in self.named_children():
            yield from child.modules()

    def train(self, mode: bool = True) -> "Module":
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    def state_dict(self) -> dict:
        """name -> numpy copy of each parameter."""
        return {name: p.numpy() for name, p in self.named_parameters()}

    def load_state_dict(self, state: dict) -> None:
        own = dict(self.named_parameters())
        missing, unexpected = set(own) - set(state), set(state) - set(own)
        if missing or unexpected:
            raise KeyError(f"load_state_dict: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
        for name, p in own.items():
            value = np.asarray(state[name])
            if value.shape != p.shape:
                raise ShapeError(f"load_state_dict: {name} has shape {p.shape}, the state has {value.shape}")
            p.copy_(Tensor(value, dtype=p.dtype))

    def __repr__(self) -> str:
        inner = "".join(f"\n  ({n}): " + repr(c).replace("\n", "\n  ") for n, c in self.named_children())
        return f"{type(self).__name__}({self.extra_repr()}{inner}{chr(10) if inner else ''})"

    def extra_repr(self) -> str:
        return ""


class Linear(Module):
    """y = x @ W^T + b, with W of shape (out, in) initialised U(-1/sqrt(in), 1/sqrt(in)) like torch."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype=np.float32):
        super().__init__()
        bound = 1.0 / math.sqrt(in_features)
        rng = generator()
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(rng.uniform(-bound, bound, (out_features, in_features)), dtype=dtype)
        self.bias = Parameter(rng.uniform(-bound, bound, (out_features,)), dtype=dtype) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ShapeError(f"Linear({self.in_features}, {self.out_features}): input has shape {x.shape}, "
                             f"its last dim must be {self.in_features}")
        y = x @ self.weight.T
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


class ReLU(Module):
    def forward(self, x):
        return x.relu()


class GELU(Module):
    def forward(self, x):
        return x.gelu()


class Tanh(Module):
    def forward(self, x):
        return x.tanh()


class Sequential(Module):
    """Apply the layers in order."""

    def __init__(self, *layers):
        super().__init__()
        self.layers = list(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def __getitem__(self, i):
        return self.layers[i]

    def __len__(self):
        return len(self.layers)


class Embedding(Module):
    """Row lookup: index i -> weight[i]. Done as one_hot(i) @ weight, so the gradient is the
    matmul's (rows that were looked up several times add up)."""

    def __init__(self, num_embeddings: int, dim: int, dtype=np.float32):
        super().__init__()
        self.num_embeddings, self.dim = num_embeddings, dim
        self.weight = Parameter(generator().standard_normal((num_embeddings, dim)), dtype=dtype)

    def forward(self, idx) -> Tensor:
        idx = np.asarray(idx.numpy() if isinstance(idx, Tensor) else idx)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_embeddings):
            raise IndexError(f"Embedding({self.num_embeddings}): index out of range [{idx.min()}, {idx.max()}]")
        return one_hot(idx, self.num_embeddings, self.weight.dtype) @ self.weight

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.dim}"


class LayerNorm(Module):
    """Normalise the last dim to mean 0, variance 1, then scale and shift (learned)."""

    def __init__(self, dim: int, eps: float = 1e-5, dtype=np.float32):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = Parameter(np.ones(dim), dtype=dtype)
        self.bias = Parameter(np.zeros(dim), dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        mu = x.mean(-1, keepdim=True)
        centered = x - mu
        var = (centered * centered).mean(-1, keepdim=True)
        return centered / (var + self.eps).sqrt() * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


class Dropout(Module):
    """In training, zero each element with probability p and scale the rest by 1/(1-p)."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = generator().random(x.shape) >= self.p
        return x * Tensor(keep / (1.0 - self.p), dtype=x.dtype)

    def extra_repr(self) -> str:
        return f"p={self.p}"
