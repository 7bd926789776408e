"""Optimizers: update each parameter from its gradient, in place, with no graph recorded."""

from __future__ import annotations

from course_lib.tensor.autodiff import no_grad
from course_lib.tensor.tensor import cat, zeros
from course_lib.tensor.tensor_data import TensorData


class Optimizer:
    """Updates all parameters as ONE flat vector ("multi-tensor apply", like torch's foreach):
    each formula in `update` then runs once per step instead of once per parameter, which
    matters because each op costs Python overhead. A parameter with no gradient this step
    gets a zero gradient in the flat vector and keeps its value."""

    def __init__(self, params, lr: float):
        self.params = [p for p in params]
        self.lr = lr
        self.state: dict = {}

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        with no_grad():
            grads = [p.grad if p.grad is not None else zeros(p.shape, dtype=p.dtype) for p in self.params]
            flat_p = cat([p.detach().reshape(-1) for p in self.params])
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


class SGD(Optimizer):
    """v = momentum * v + (g + wd * p);  p = p - lr * v   (torch's convention)."""

    def __init__(self, params, lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, lr)
        self.momentum, self.weight_decay = momentum, weight_decay

    def update(self, p, g, state):
        if self.weight_decay:
            g = g + self.weight_decay * p
        if self.momentum:
            v = state.get("v")
            state["v"] = v = g if v is None else self.momentum * v + g
            g = v
        return p - self.lr * g


class Adam(Optimizer):
    """Running means of g and g^2, corrected for their start at zero:
    m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr * m_hat / (sqrt(v_hat) + eps)."""

    decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, lr)
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay

    def update(self, p, g, state):
        b1, b2 = self.betas
        if self.weight_decay and not self.decoupled:
            g = g + self.weight_decay * p  # L2 penalty, folded into the gradient
        t = state["t"] = state.get("t", 0) + 1
        m = state["m"] = (1 - b1) * g if t == 1 else b1 * state["m"] + (1 - b1) * g
        v = state["v"] = (1 - b2) * g * g if t == 1 else b2 * state["v"] + (1 - b2) * (g * g)
        m_hat = m / (1 - b1 ** t)
        v_hat = v / (1 - b2 ** t)
        if self.weight_decay and self.decoupled:
            p = p * (1 - self.lr * self.weight_decay)  # AdamW: shrink the weights directly
        return p - self.lr * m_hat / (v_hat.sqrt() + self.eps)


class AdamW(Adam):
    """Adam with decoupled weight decay: p *= 1 - lr * wd, apart from the gradient."""

    decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01):
        super().__init__(params, lr, betas, eps, weight_decay)
