"""The course's answers to exercises 12.9 (`adamw`), 12.10 (`lr_schedule`) and 12.11 (`clip_grad_norm`):
read each once your check passes.

AdamW keeps torch's interface (param_groups with their own "lr" and "weight_decay", zero_grad, step,
state_dict, load_state_dict), and its moments are chapter 02's `adam_step` (numpy), one parameter at a time.
"""

import math

import numpy as np

from course_lib.tensor import Tensor


def adam_step(p, g, m, v, t, lr, b1, b2, eps):
    """Chapter 02's Adam step in numpy (its exercise): the new p, m and v."""
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    return p - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps), m, v


def param_groups(model, weight_decay):
    """The course's answer to exercise 12.9 (`adamw`): read it once your check passes.

    Two groups: the matrices (linear layers' weights, embeddings) decay; biases and layer-norm gains,
    vectors, do not (pulling a gain toward 0 only hurts)."""
    params = model.parameters()
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


class AdamW:
    """The course's answer to exercise 12.9 (`adamw`): read it once your check passes.

    Decoupled weight decay: each step first shrinks p by (1 - lr * weight_decay), apart from the
    gradient, then takes chapter 02's Adam step. Every group has its own lr and weight_decay (the
    constructor's unless the group names one). The state, one {"step", "m", "v"} per parameter by its
    position, and each group's options are what `state_dict` returns and `load_state_dict` puts back."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, adam_step=adam_step):
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.param_groups = [{"lr": lr, "weight_decay": weight_decay, **group, "params": list(group["params"])}
                             for group in groups]
        self.betas, self.eps, self.adam_step = tuple(betas), eps, adam_step
        self.state = {}

    def _numbered(self):
        """(position, parameter, its group) for every parameter, groups in order."""
        params = [(p, group) for group in self.param_groups for p in group["params"]]
        return [(i, p, group) for i, (p, group) in enumerate(params)]

    def zero_grad(self, set_to_none=True):
        for _, p, _ in self._numbered():
            p.grad = None

    def step(self):
        b1, b2 = self.betas
        for i, p, group in self._numbered():
            if p.grad is None:
                continue
            if i not in self.state:
                self.state[i] = {"step": 0, "m": np.zeros(p.shape, p.dtype), "v": np.zeros(p.shape, p.dtype)}
            state = self.state[i]
            state["step"] += 1
            lr = group["lr"]
            decayed = p.numpy() * (1 - lr * group["weight_decay"])
            new, state["m"], state["v"] = self.adam_step(decayed, p.grad.numpy(), state["m"], state["v"],
                                                         state["step"], lr, b1, b2, self.eps)
            p.copy_(Tensor(new, dtype=p.dtype))

    def state_dict(self):
        return {"state": {i: {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in s.items()}
                          for i, s in self.state.items()},
                "param_groups": [{k: v for k, v in group.items() if k != "params"} for group in self.param_groups]}

    def load_state_dict(self, state_dict):
        self.state = {int(i): {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in s.items()}
                      for i, s in state_dict["state"].items()}
        for group, saved in zip(self.param_groups, state_dict["param_groups"]):
            group.update(saved)


def lr_at(it, cfg):
    """The course's answer to exercise 12.10 (`lr_schedule`): read it once your check passes.

    Linear warmup to cfg.lr over cfg.warmup_iters steps (step 0 already takes a step's share), then a
    cosine from cfg.lr down to cfg.min_lr at cfg.lr_decay_iters, and min_lr after."""
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / cfg.warmup_iters
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    progress = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def clip_grad_norm(params, max_norm):
    """The course's answer to exercise 12.11 (`clip_grad_norm`): read it once your check passes.

    One norm over every gradient together; when it exceeds max_norm, every gradient is scaled by the same
    max_norm / (norm + 1e-6), so the whole gradient keeps its direction. Returns the norm before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
    scale = max_norm / (norm + 1e-6)
    if scale < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad = p.grad * scale
    return norm
