"""Gradient checking: exact gradients against nudging, the course's test of every backward pass.

Chapter 00's exercises write these three functions; these are the course's own, which later chapters
use (chapter 01's and 02's lessons and checks, chapter 08's) so that every exact gradient in the course
is compared with the numerical estimate. Each answers an exercise of chapter 00: read it once your
check passes.
"""

import numpy as np


def numerical_derivative(f, x, h=1e-5):
    """The course's answer to exercise 00.1 (`numerical_derivative`): read it once your check passes.

    f'(x) for a function f of one float, by the central difference: its error falls like h**2."""
    return (f(x + h) - f(x - h)) / (2 * h)


def numerical_gradient(f, x, h=1e-5):
    """The course's answer to exercise 00.2 (`numerical_gradient`): read it once your check passes.

    The gradient of f (array -> float) at x by central differences, one element at a time. x is
    nudged in place and restored, so it is unchanged afterwards."""
    x = np.asarray(x, dtype=np.float64)
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + h
        up = f(x)
        x[i] = old - h
        down = f(x)
        x[i] = old
        grad[i] = (up - down) / (2 * h)
    return grad


def relative_error(a, b):
    """The worst elementwise relative error between a and b, scaled by |a| + |b| (at least 1e-12)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(a) + np.abs(b), 1e-12)))


def gradient_check(f, grad_f, x, h=1e-5):
    """The course's answer to exercise 00.3 (`gradient_check`): read it once your check passes.

    The worst relative error between the analytic gradient grad_f(x) and the numerical one: about
    1e-8 or less when grad_f is right, near 1 when it is not."""
    x = np.array(x, dtype=np.float64)
    return relative_error(grad_f(x), numerical_gradient(f, x, h))
