"""What a compiled step asks of the code it captures: no Python numbers that change, no values read mid-step.

Chapter 12's training step (`gpt.trainer.train_step` on the capstone's library, `capstone.COURSE`) reads
values mid-step, as eager code may:

- its `clip_grad_norm` reads the global norm with `float()` and tests it in Python: a graph break.
  `clip_grad_norm` below computes the same scale with tensor ops, min(1, max_norm / (norm + 1e-6)), and
  always multiplies by it (by exactly 1.0 when the norm is small, which changes nothing).
- its AdamW computes the update in numpy (chapter 02's `adam_step`), reading every parameter mid-step. And
  an Adam written with the library's ops, `optim.AdamW`, keeps its step count t as a Python int and bakes
  1 - b1**t into each step, and a schedule gives it a new float lr at each step: a replay would repeat the
  first call's numbers. `AdamW` below keeps them in tensors (as torch's `capturable=True` optimizers keep
  theirs): the step count is a 0-d tensor of the optimizer's state, counted up by the step itself, and
  `lr` is a 0-d tensor that `set_lr` fills in place, between calls.

`CAPTURABLE` is the course's library with these in place of the eager ones: the `Library` that chapter 04's
recipe takes, so the step a compiler captures is the recipe's own,

    optimizer = trainer.configure_optimizer(model, cfg, CAPTURABLE)
    step = compile(trainer.train_step)
    loss = step(model, optimizer, x, y, cfg.grad_clip, CAPTURABLE)
"""

import numpy as np

from course_lib.gpt.trainer import Library
from course_lib.tensor import Tensor, no_grad, optim, where, zeros


class AdamW(optim.AdamW):
    """optim.AdamW with its step count and learning rate in tensors, so a captured step reads them."""

    @property
    def lr(self):
        return self._lr

    @lr.setter
    def lr(self, value):
        """Fill the 0-d tensor in place. Set the rate this way (CAPTURABLE.set_lr does), between calls: a
        schedule that writes only `param_groups` is not read by a captured step. The groups follow, for readers."""
        for group in self.param_groups:
            group["lr"] = float(value.item() if isinstance(value, Tensor) else value)
        if isinstance(value, Tensor):
            self._lr = value
        elif getattr(self, "_lr", None) is None:
            self._lr = Tensor(np.array(value, dtype=self.params[0].dtype))
        else:
            self._lr.copy_(float(value))

    def update(self, p, g, state):
        b1, b2 = self.betas
        if "step" not in state:
            state["step"] = zeros((), dtype=p.dtype)
            state["m"], state["v"] = zeros(p.shape, dtype=p.dtype), zeros(p.shape, dtype=p.dtype)
        t = state["step"] = state["step"] + 1.0
        m = state["m"] = b1 * state["m"] + (1 - b1) * g
        v = state["v"] = b2 * state["v"] + (1 - b2) * (g * g)
        decay = self.per_element("weight_decay", self.weight_decay, p)
        if decay is not None:
            p = p * (1 - self.lr * decay)
        m_hat = m / (1 - b1 ** t)
        v_hat = v / (1 - b2 ** t)
        return p - self.lr * m_hat / (v_hat.sqrt() + self.eps)


class Adam(AdamW):
    """Adam (weight decay folded into the gradient) with its numbers in tensors."""

    decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, lr, betas, eps, weight_decay)

    def update(self, p, g, state):
        decay = self.per_element("weight_decay", self.weight_decay, p)
        if decay is not None:
            g = g + decay * p
        weight_decay, self.weight_decay = self.weight_decay, 0.0
        try:
            return super().update(p, g, state)
        finally:
            self.weight_decay = weight_decay


def clip_grad_norm(params, max_norm):
    """optim.clip_grad_norm_ without leaving the graph: every gradient times min(1, max_norm / (norm + 1e-6)).
    Returns the norm before clipping, as a 0-d tensor."""
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    with no_grad():
        norm = sum((g * g).sum() for g in grads).sqrt()
        scale = max_norm / (norm + 1e-6)
        scale = where(scale < 1.0, scale, 1.0)
        for p in params:
            if p.grad is not None:
                p.grad = p.grad * scale
    return norm


def set_lr(optimizer, lr):
    """The schedule's way in: fill the optimizer's 0-d learning-rate tensor, between calls."""
    optimizer.lr = lr


CAPTURABLE = Library("course_lib.tensor, capturable", AdamW, clip_grad_norm, no_grad, set_lr=set_lr)
