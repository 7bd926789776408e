"""Chapter 02's checks pass on the reference and reject the usual mistakes."""

import numpy as np
import pytest

import course_lib.tensor as ct
from checking import expect_failure
from course_lib.checks import ch02 as check
from course_lib.tensor import nn, optim


# ------------------------------------------------------------------ references

def strides(shape):
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def position(index, strides, offset=0):
    return offset + sum(i * s for i, s in zip(index, strides))


def broadcast(a, b):
    return tuple(np.broadcast_shapes(a, b))


def sum_to(g, shape):
    while g.ndim > len(shape):
        g = g.sum(0)
    return g.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1), keepdims=True)


def mul_bw(a, b, g):
    return sum_to(g * b, a.shape), sum_to(g * a, b.shape)


def matmul_bw(a, b, g):
    return g @ np.swapaxes(b, -1, -2), np.swapaxes(a, -1, -2) @ g


def sum_bw(g, shape, dim, keepdim):
    return np.broadcast_to(g if keepdim else np.expand_dims(g, dim), shape).copy()


def mean_bw(g, shape, dim, keepdim):
    return sum_bw(g, shape, dim, keepdim) / shape[dim]


def log_softmax(x):
    s = x - x.max(-1, keepdims=True)
    return s - np.log(np.exp(s).sum(-1, keepdims=True))


def ce(x, t):
    return -log_softmax(x)[np.arange(len(t)), t].mean()


class Linear(nn.Module):
    def __init__(self, i, o, bias=True, transpose=True):
        super().__init__()
        b = 1 / np.sqrt(i)
        self.weight = nn.Parameter(ct.generator().uniform(-b, b, (o, i)), dtype=np.float32)
        self.bias = nn.Parameter(ct.generator().uniform(-b, b, (o,)), dtype=np.float32)
        self.use_bias = bias

    def forward(self, x):
        y = x @ self.weight.T
        return y + self.bias if self.use_bias else y


def sgd(p, g, v, lr, mom):
    v = mom * v + g
    return p - lr * v, v


def adam(p, g, m, v, t, lr, b1, b2, eps, correct=True):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    mh, vh = (m / (1 - b1**t), v / (1 - b2**t)) if correct else (m, v)
    return p - lr * mh / (np.sqrt(vh) + eps), m, v


def train_epoch(model, loader, opt, zero=True, step=True):
    losses = []
    for x, y in loader:
        loss = ct.cross_entropy(model(x), y)
        if zero:
            opt.zero_grad()
        loss.backward()
        if step:
            opt.step()
        losses.append(loss.item())
    return float(np.mean(losses))


def test_reference_passes(capsys):
    check.strides(strides, position)
    check.broadcast_shape(broadcast)
    check.mul_backward(mul_bw)
    check.matmul_backward(matmul_bw)
    check.sum_mean_backward(sum_bw, mean_bw)
    check.softmax_cross_entropy(log_softmax, ce)
    check.linear(Linear)
    check.optimizer_steps(sgd, adam)
    check.training_loop(train_epoch)
    assert capsys.readouterr().out.count("passed") == 9


def test_strides_rejects():
    expect_failure(check.strides, lambda s: tuple(reversed(strides(s))), position, match="reversed")
    expect_failure(check.strides, strides, lambda i, s, o=0: position(i, s), match="offset")
    expect_failure(check.strides, lambda s: None, position, match="return")


def test_broadcast_shape_rejects():
    def left_aligned(a, b):
        return tuple(max(x, y) for x, y in zip(a, b))

    def never_raises(a, b):
        n = max(len(a), len(b))
        a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
        return tuple(max(x, y) for x, y in zip(a, b))

    expect_failure(check.broadcast_shape, left_aligned)
    expect_failure(check.broadcast_shape, never_raises, match="do not broadcast")


def test_mul_backward_rejects():
    expect_failure(check.mul_backward, lambda a, b, g: (g * b, g * a), match="summed back")
    expect_failure(check.mul_backward, lambda a, b, g: (sum_to(g * a, a.shape), sum_to(g * b, b.shape)),
                   match="OTHER operand")
    expect_failure(check.mul_backward, lambda a, b, g: sum_to(g * b, a.shape))


def test_matmul_backward_rejects():
    expect_failure(check.matmul_backward, lambda a, b, g: (g @ b, a @ g) if a.shape[-1] == b.shape[-1] else matmul_bw(a, b, g),
                   match="missing transpose")
    expect_failure(check.matmul_backward, lambda a, b, g: (np.swapaxes(b, -1, -2) @ g, g @ np.swapaxes(a, -1, -2)))
    expect_failure(check.matmul_backward, lambda a, b, g: (g @ b.T, a.T @ g))  # .T breaks the batched case


def test_sum_mean_backward_rejects():
    expect_failure(check.sum_mean_backward, sum_bw, sum_bw, match="grad / n")
    expect_failure(check.sum_mean_backward, sum_bw, lambda g, s, d, k: sum_bw(g, s, d, k) / np.prod(s),
                   match="reduced dim only")
    expect_failure(check.sum_mean_backward, lambda g, s, d, k: np.broadcast_to(g, s), mean_bw)


def test_softmax_cross_entropy_rejects():
    def unstable(x):
        return np.log(np.exp(x) / np.exp(x).sum(-1, keepdims=True))

    expect_failure(check.softmax_cross_entropy, unstable, ce, match="unstable")
    expect_failure(check.softmax_cross_entropy, log_softmax,
                   lambda x, t: -log_softmax(x)[np.arange(len(t)), t].sum(), match="MEAN")
    expect_failure(check.softmax_cross_entropy, log_softmax,
                   lambda x, t: log_softmax(x)[np.arange(len(t)), t].mean(), match="MINUS")


def test_linear_rejects():
    expect_failure(check.linear, lambda i, o: Linear(i, o, bias=False), match="forgot the bias")

    class Transposed(Linear):
        def __init__(self, i, o):
            super().__init__(i, o)
            self.weight = nn.Parameter(self.weight.numpy().T.copy())

        def forward(self, x):
            return x @ self.weight + self.bias

    expect_failure(check.linear, Transposed, match="weight.shape")

    class NormalInit(Linear):
        def __init__(self, i, o):
            super().__init__(i, o)
            self.weight = nn.Parameter(ct.generator().standard_normal((o, i)), dtype=np.float32)

    expect_failure(check.linear, NormalInit, match="uniform")


def test_optimizer_steps_rejects():
    expect_failure(check.optimizer_steps, lambda p, g, v, lr, m: (p - lr * g, v), adam, match="velocity")
    expect_failure(check.optimizer_steps, sgd, lambda *a: adam(*a, correct=False), match="bias correction")
    expect_failure(check.optimizer_steps, lambda p, g, v, lr, m: (p - lr * (m * v + g), v), adam)


def test_training_loop_rejects():
    expect_failure(check.training_loop, lambda m, l, o: train_epoch(m, l, o, zero=False), match="zero_grad")
    expect_failure(check.training_loop, lambda m, l, o: train_epoch(m, l, o, step=False), match="opt.step")
    expect_failure(check.training_loop, lambda m, l, o: train_epoch(m, l, o) * 2, match="mean batch loss")
