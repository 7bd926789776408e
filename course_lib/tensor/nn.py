"""Modules: objects that own parameters and map tensors to tensors, as in torch.nn."""

from __future__ import annotations

import math

import numpy as np

from course_lib.tensor.registry import OPS as F  # functions.py's ops, unless a use_ops block put others in
from course_lib.tensor.tensor import Tensor, generator
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

    def named_parameters(self, prefix: str = "", remove_duplicate: bool = True):
        """(name, parameter) pairs, this module's own first. A parameter shared by two modules (tied
        weights) comes once, under its first name, unless remove_duplicate is False (as in torch)."""
        seen = set()
        for name, p in self._named_parameters(prefix):
            if not remove_duplicate or id(p) not in seen:
                seen.add(id(p))
                yield name, p

    def _named_parameters(self, prefix):
        for name, value in vars(self).items():
            if isinstance(value, Parameter):
                yield prefix + name, value
        for name, child in self.named_children():
            yield from child._named_parameters(f"{prefix}{name}.")

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
        """name -> numpy copy of each parameter (a tied one under each of its names, as in torch)."""
        return {name: p.numpy() for name, p in self.named_parameters(remove_duplicate=False)}

    def load_state_dict(self, state: dict) -> None:
        """Copy values in by name; values may be numpy arrays or CPU torch tensors."""
        own = dict(self.named_parameters(remove_duplicate=False))
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
        # (..., in) as one (rows, in) matrix: the weight's gradient is then one matmul, not one per
        # batch entry summed afterwards
        y = x.reshape(-1, self.in_features) @ self.weight.T
        y = y + self.bias if self.bias is not None else y
        return y.reshape(x.shape[:-1] + (self.out_features,))

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


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
