"""Optimizers: update each parameter from its gradient, in place, with no graph recorded.

The update rules of SGD with momentum and Adam, the course's answers to exercise 02.10, are in
update_rules.py (read them once your check passes); this file applies them to all parameters at once.
"""

from __future__ import annotations

import math

import numpy as np

from course_lib.tensor.autodiff import no_grad
from course_lib.tensor.backend import current_backend
from course_lib.tensor.tensor import Tensor, cat, zeros
from course_lib.tensor.tensor_data import TensorData
from course_lib.tensor.update_rules import adam_step, sgd_momentum_step


class Optimizer:
    """Updates all parameters as ONE flat vector ("multi-tensor apply", like torch's foreach):
    each formula in `update` then runs once per step instead of once per parameter, which
    matters because each op costs Python overhead. A parameter with no gradient this step
    gets a zero gradient in the flat vector and keeps its value.

    `params` is a list of parameters, or of groups as in torch, each a dict with "params" and
    options of its own: [{"params": matrices, "weight_decay": 0.1}, {"params": biases, "weight_decay": 0.0}].
    Every group carries its own "lr" (the constructor's lr unless it names one), and a schedule sets
    them as in torch: `for group in optimizer.param_groups: group["lr"] = lr_at(it)`."""

    def __init__(self, params, lr: float):
        params = list(params)
        groups = params if params and isinstance(params[0], dict) else [{"params": params}]
        self.param_groups = [dict(group, params=list(group["params"])) for group in groups]
        self.params = [p for group in self.param_groups for p in group["params"]]
        own = [group.get("lr") for group in self.param_groups]
        self.lr = lr                           # the default for every group (a subclass may keep lr its own way)
        for group, value in zip(self.param_groups, own):
            if value is not None:
                group["lr"] = value            # a group's own "lr" wins, as in torch
        self.state: dict = {}
        self._per_element: dict = {}

    @property
    def lr(self):
        """The learning rate, as `update` reads it: one number when every group has the same (the usual
        case), else a flat tensor holding each parameter's group's lr."""
        return self.per_element("lr", None, self.params[0] if self.params else None, keep_zero=True)

    @lr.setter
    def lr(self, value):
        """Set every group's lr, as a schedule does (`optimizer.lr = lr_at(it)`)."""
        for group in self.param_groups:
            group["lr"] = value

    def per_element(self, option: str, default, like, keep_zero: bool = False):
        """The value of a group option for each entry of the flat vector `like`: one number if all groups
        agree (None instead of 0 unless keep_zero, so that a zero weight decay costs no op), else a flat
        tensor. The tensor is rebuilt only when the groups' values change: a schedule changes lr each step."""
        values = tuple(float(group.get(option, default)) for group in self.param_groups)
        if len(set(values)) == 1:
            return values[0] if values[0] != 0 or keep_zero else None
        key = (values, np.dtype(like.dtype).str)
        cached = self._per_element.get(option)
        if cached is None or cached[0] != key:
            sizes = [sum(p.numel() for p in group["params"]) for group in self.param_groups]
            flat = np.concatenate([np.full(n, v) for n, v in zip(sizes, values)])
            self._per_element[option] = cached = (key, Tensor(flat, dtype=like.dtype))
        return cached[1]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients before the next backward (which adds into any it finds). As in torch,
        set_to_none=False keeps each gradient as zeros instead; a parameter without one stays without."""
        for p in self.params:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad = zeros(p.shape, dtype=p.dtype)

    def step(self) -> None:
        with no_grad():
            grads = [p.grad if p.grad is not None else zeros(p.shape, dtype=p.dtype) for p in self.params]
            flat_p = _joined(self.params)
            flat_g = cat([g.reshape(-1) for g in grads])
            new = self.update(flat_p, flat_g, self.state).contiguous().data
            start = new.offset
            for p in self.params:  # each parameter becomes a view into the new flat vector
                if p.grad is not None:
                    p._assign(TensorData(new.storage, p.shape, None, start))
                start += p.numel()

    def update(self, p, g, state):
        """Return the new value of parameter p, given its gradient g and its state dict."""
        raise NotImplementedError


def _joined(params) -> Tensor:
    """The parameters as one flat vector: a view when they lie back to back in one storage, as every
    step leaves them (each becomes a view into the step's new vector), else a copy made by cat."""
    first = params[0].data
    end = first.offset
    for p in params:
        if p.data.storage is not first.storage or p.data.offset != end or not p.data.is_contiguous():
            return cat([p.detach().reshape(-1) for p in params])
        end += p.data.size
    return Tensor._wrap(TensorData(first.storage, (end - first.offset,), None, first.offset))


class SGD(Optimizer):
    """v = momentum * v + (g + wd * p);  p = p - lr * v   (torch's convention; lr, momentum and
    weight_decay may differ from group to group)."""

    def __init__(self, params, lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, lr)
        self.momentum, self.weight_decay = momentum, weight_decay

    def update(self, p, g, state):
        decay = self.per_element("weight_decay", self.weight_decay, p)
        if decay is not None:
            g = g + decay * p
        momentum = self.per_element("momentum", self.momentum, p)
        if momentum is None:
            return p - self.lr * g
        p, state["v"] = sgd_momentum_step(p, g, state.get("v"), self.lr, momentum)
        return p


class Adam(Optimizer):
    """Running means of g and g^2, corrected for their start at zero:
    m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr * m_hat / (sqrt(v_hat) + eps).

    A backend with an `adam` method (chapter 06's) runs the whole update as one kernel instead,
    when all groups share one lr (the kernel takes one number; a flat lr goes the tensor way)."""

    decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, lr)
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay

    def update(self, p, g, state):
        fused = getattr(current_backend(), "adam", None)
        lr = self.lr
        if fused is not None and not isinstance(lr, Tensor) and p.data.is_contiguous() and g.data.is_contiguous():
            return self.fused_update(fused, p, g, state)
        b1, b2 = self.betas
        decay = self.per_element("weight_decay", self.weight_decay, p)
        if decay is not None and not self.decoupled:
            g = g + decay * p  # L2 penalty, folded into the gradient
        t = state["t"] = state.get("t", 0) + 1
        if decay is not None and self.decoupled:
            p = p * (1 - lr * decay)  # AdamW: shrink the weights directly
        p, state["m"], state["v"] = adam_step(p, g, state.get("m"), state.get("v"), t, lr, b1, b2, self.eps)
        return p

    def fused_update(self, fused, p, g, state):
        """The update above as the backend's one kernel: it writes m and v in place, returns the new p."""
        t = state["t"] = state.get("t", 0) + 1
        if t == 1:
            state["m"], state["v"] = zeros(p.shape, dtype=p.dtype), zeros(p.shape, dtype=p.dtype)
        decay = self.per_element("weight_decay", self.weight_decay, p)
        decay = decay.data if isinstance(decay, Tensor) else decay
        return p._new(fused(p.data, g.data, state["m"].data, state["v"].data, self.lr, self.betas, self.eps, t,
                            decay, self.decoupled))


class AdamW(Adam):
    """Adam with decoupled weight decay: p *= 1 - lr * wd, apart from the gradient."""

    decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01):
        super().__init__(params, lr, betas, eps, weight_decay)


def clip_grad_norm_(params, max_norm: float) -> float:
    """Scale every gradient by one factor so that their global L2 norm is at most max_norm, as
    torch.nn.utils.clip_grad_norm_ (factor max_norm / (norm + 1e-6)). Returns the norm before clipping.

    One factor for all keeps the direction of the whole gradient; clipping each alone would bend it."""
    grads = [p.grad for p in params if p.grad is not None]
    with no_grad():
        flat = [g.reshape(-1) for g in grads]
        norm = math.sqrt(sum((f * f).sum().item() for f in flat))
        scale = max_norm / (norm + 1e-6)
        if scale < 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad = p.grad * scale
    return norm
