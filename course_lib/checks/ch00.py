"""Checks for chapter 00, the warm-up: numerical derivatives and gradient checking."""

import numpy as np
import torch

from course_lib.checks import assert_close, exercise, require, rng, CheckFailed, fmt

# Scalar test functions, each as (description, numpy function, torch function).
_FUNCS = [
    ("x**3 - 2*x", lambda x: x**3 - 2 * x, lambda x: x**3 - 2 * x),
    ("sin(3x) * x", lambda x: np.sin(3 * x) * x, lambda x: torch.sin(3 * x) * x),
    ("exp(x / 2) / (1 + x**2)", lambda x: np.exp(x / 2) / (1 + x**2), lambda x: torch.exp(x / 2) / (1 + x**2)),
    ("tanh(2x - 1)", lambda x: np.tanh(2 * x - 1), lambda x: torch.tanh(2 * x - 1)),
]


def _torch_derivative(tf, x):
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tf(t).backward()
    return t.grad.item()


@exercise
def numerical_derivative(numerical_derivative):
    """Central difference f'(x) ~ (f(x+h) - f(x-h)) / 2h against PyTorch's exact derivative."""
    n = 0
    for desc, f, tf in _FUNCS:
        for x in rng().uniform(-2, 2, size=3):
            x = float(x)
            h = 1e-5
            yours = numerical_derivative(f, x)
            expected = _torch_derivative(tf, x)
            forward = (f(x + h) - f(x)) / h
            assert_close(yours, expected, what=f"the derivative of f(x) = {desc} at x = {x:.6f}",
                         rtol=1e-7, atol=1e-8,
                         mistakes={"that is the one-sided difference (f(x+h) - f(x)) / h; "
                                   "use the central difference (f(x+h) - f(x-h)) / (2h)": forward,
                                   "twice the derivative: divide by 2h, not h": 2 * expected,
                                   "half the derivative: the step from x-h to x+h is 2h, not 4h": expected / 2})
            n += 1
    return f"{n} random points on {len(_FUNCS)} functions"


def _vector_fn(rng_, shape):
    """A random smooth function of an array, as a numpy and a torch version."""
    a = rng_.uniform(-1, 1, size=shape)
    c = float(rng_.uniform(0.5, 2))
    f = lambda x: float(np.sum(np.sin(c * x) * a) + np.sum(x**2 * a) ** 2 / 4)
    tf = lambda x: torch.sum(torch.sin(c * x) * torch.tensor(a)) + torch.sum(x**2 * torch.tensor(a)) ** 2 / 4
    return f, tf


@exercise
def numerical_gradient(numerical_gradient):
    """The gradient of f: R^shape -> R by central differences, one element at a time."""
    shapes = [(int(rng().integers(2, 8)),), (3, 5), (2, 3, 4)]
    for shape in shapes:
        f, tf = _vector_fn(rng(), shape)
        x = rng().uniform(-1.5, 1.5, size=shape)
        x_before = x.copy()
        yours = numerical_gradient(f, x)
        require(np.array_equal(x, x_before),
                f"your function changed its input x (first change at index "
                f"{tuple(int(i) for i in np.argwhere(x != x_before)[0]) if (x != x_before).any() else '?'}).",
                hint="after nudging x[i] by +h and -h, put the original value back.")
        t = torch.tensor(x, requires_grad=True)
        tf(t).backward()
        assert_close(yours, t.grad.numpy(), what=f"the gradient for an input of shape {shape}",
                     rtol=1e-6, atol=1e-7, inputs={"x": x},
                     hint="nudge one element at a time (np.ndindex walks every index) and keep the other elements fixed.")
    return "3 random functions of 1-D, 2-D and 3-D inputs"


def _relative_error(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(a) + np.abs(b), 1e-12)))


@exercise
def gradient_check(gradient_check, numerical_gradient):
    """max_i |g_i - n_i| / max(|g_i| + |n_i|, 1e-12) with n the numerical gradient."""
    shape = (3, int(rng().integers(3, 7)))
    f, tf = _vector_fn(rng(), shape)
    x = rng().uniform(-1.5, 1.5, size=shape)

    def true_grad(x):
        t = torch.tensor(x, requires_grad=True)
        tf(t).backward()
        return t.grad.numpy()

    good = gradient_check(f, true_grad, x)
    require(np.ndim(good) == 0, f"gradient_check should return one number (the worst element), got {fmt(good)}.",
            hint="take the max over all elements.")
    require(0 <= float(good) < 1e-6,
            f"a correct gradient should give a tiny relative error (below 1e-6); yours says {fmt(float(good))}.",
            hint="compare grad_f(x) with numerical_gradient(f, x), elementwise.")
    # Gradients with planted bugs: the error must reflect them, and be exactly the formula.
    i = tuple(int(v) for v in rng().integers(0, shape))
    one_wrong = lambda x: true_grad(x) + np.where(np.arange(x.size).reshape(x.shape) == np.ravel_multi_index(i, x.shape), 0.3, 0.0)
    for name, buggy in [("a gradient wrong in one element", one_wrong),
                        ("a gradient with the wrong sign", lambda x: -true_grad(x)),
                        ("a gradient scaled by 3", lambda x: 3 * true_grad(x))]:
        yours = gradient_check(f, buggy, x)
        expected = _relative_error(buggy(x), true_grad(x))
        g, n = buggy(x), true_grad(x)
        assert_close(yours, expected, what=f"the relative error for {name}", rtol=1e-4, atol=1e-9,
                     mistakes={"that is the mean over elements; report the max (the worst element)":
                               float(np.mean(np.abs(g - n) / np.maximum(np.abs(g) + np.abs(n), 1e-12))),
                               "that is the absolute error; divide by |g| + |n|": float(np.max(np.abs(g - n))),
                               "take the absolute value of g - n (and of g and n in the denominator)":
                               float(np.max((g - n) / np.maximum(g + n, 1e-12)))})
    return "a correct gradient and 3 planted bugs"
