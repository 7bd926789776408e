"""The update rules of SGD with momentum and Adam: the course's answers to exercise 02.10.

Read them once your check passes. Each takes a parameter, its gradient and its running state and
returns the new parameter and state; optim.py's SGD and Adam apply them to every parameter at once,
as one flat vector. A state that is None has not started: the first step sets it from the gradient.
"""


def sgd_momentum_step(p, g, v, lr, momentum):
    """The course's answer to exercise 02.10 (`optimizer_steps`): read it once your check passes.

    v = momentum * v + g, then p - lr * v (PyTorch's form). Returns (p, v)."""
    v = g if v is None else momentum * v + g
    return p - lr * v, v


def adam_step(p, g, m, v, t, lr, b1, b2, eps):
    """The course's answer to exercise 02.10 (`optimizer_steps`): read it once your check passes.

    Running means of g and g^2, divided by 1 - b**t to undo their start at zero (t counts from 1).
    Returns (p, m, v), the running means as they are, uncorrected, for the next step."""
    m = (1 - b1) * g if m is None else b1 * m + (1 - b1) * g
    v = (1 - b2) * g * g if v is None else b2 * v + (1 - b2) * (g * g)
    m_hat = m / (1 - b1 ** t)
    v_hat = v / (1 - b2 ** t)
    return p - lr * m_hat / (v_hat.sqrt() + eps), m, v
