"""Module and Parameter: the frame every layer is written in, as in torch.nn.

A Module owns Parameters (tensors it trains) and sub-Modules as plain attributes, and finds them by
looking at its attributes; `forward` says what it computes. The layers are in nn.py.
"""

from __future__ import annotations

import numpy as np

from course_lib.tensor.tensor import Tensor
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
