"""Layers: Modules that map tensors to tensors, as in torch.nn.

Module and Parameter, the frame they are written in, are in module.py; Linear, the course's answer to
exercise 02.9, in linear.py (read it once your check passes).
"""

from __future__ import annotations

import numpy as np

from course_lib.tensor.linear import Linear  # noqa: F401  (nn.Linear, as in torch)
from course_lib.tensor.module import Module, Parameter
from course_lib.tensor.registry import OPS as F  # functions.py's ops, unless a use_ops block put others in
from course_lib.tensor.tensor import Tensor, generator
from course_lib.tensor.tensor_data import ShapeError


class ReLU(Module):
    def forward(self, x):
        return x.relu()


class GELU(Module):
    """The exact GELU, or GPT-2's tanh form with approximate="tanh" (as torch.nn.GELU)."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return x.gelu(self.approximate)


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


class ModuleDict(Module):
    """Named sub-modules, reachable as attributes (`transformer.wte`): a namespace for parameter names."""

    def __init__(self, modules: dict):
        super().__init__()
        for name, module in modules.items():
            setattr(self, name, module)


class Embedding(Module):
    """Row lookup: index i -> weight[i], the op registry's "Embedding": by default one_hot(i) @ weight
    (functions.py); chapter 12 writes it as one op, without the (positions x vocabulary) matrix of zeros."""

    def __init__(self, num_embeddings: int, dim: int, dtype=np.float32):
        super().__init__()
        self.num_embeddings, self.dim = num_embeddings, dim
        self.weight = Parameter(generator().standard_normal((num_embeddings, dim)), dtype=dtype)

    def forward(self, idx) -> Tensor:
        idx = np.asarray(idx.numpy() if isinstance(idx, Tensor) else idx)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_embeddings):
            raise IndexError(f"Embedding({self.num_embeddings}): index out of range [{idx.min()}, {idx.max()}]")
        return F.Embedding.apply(self.weight, idx=idx.astype(np.int64))

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.dim}"


class LayerNorm(Module):
    """Normalise the last dim to mean 0, variance 1, then scale and shift (learned): the op registry's
    "LayerNorm", by default a dozen recorded ops (functions.py); chapter 12 writes it as one fused op."""

    def __init__(self, dim: int, eps: float = 1e-5, dtype=np.float32):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = Parameter(np.ones(dim), dtype=dtype)
        self.bias = Parameter(np.zeros(dim), dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.dim:
            raise ShapeError(f"LayerNorm({self.dim}): input has shape {x.shape}, its last dim must be {self.dim}")
        return F.LayerNorm.apply(x, self.weight, self.bias, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


class Dropout(Module):
    """In training, zero each element with probability p and scale the rest by 1/(1-p).

    The masks come from `generator` (a numpy Generator) if given, else from the library's
    generator (`manual_seed`): either way, a seeded run draws the same masks again."""

    def __init__(self, p: float = 0.5, generator: np.random.Generator | None = None):
        super().__init__()
        self.p, self.generator = p, generator

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = (self.generator or generator()).random(x.shape) >= self.p
        return x * Tensor(keep / (1.0 - self.p), dtype=x.dtype)

    def extra_repr(self) -> str:
        return f"p={self.p}"
