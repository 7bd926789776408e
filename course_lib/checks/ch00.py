"""Checks for chapter 00, the warm-up: numerical derivatives and gradient checking.

The oracles are PyTorch's exact derivatives, and for the steps that depend on h, central differences
computed here on perturbed copies of the input, all at once (the course's own tools, which later
chapters use, are in course_lib/gradcheck.py).
"""

import numpy as np
import torch

from course_lib.checks import assert_close, exercise, fmt, require, rng

# Scalar test functions, each as (description, numpy function, torch function).
_FUNCS = [
    ("x**3 - 2*x", lambda x: x**3 - 2 * x, lambda x: x**3 - 2 * x),
    ("sin(3x) * x", lambda x: np.sin(3 * x) * x, lambda x: torch.sin(3 * x) * x),
    ("exp(x / 2) / (1 + x**2)", lambda x: np.exp(x / 2) / (1 + x**2), lambda x: torch.exp(x / 2) / (1 + x**2)),
    ("tanh(2x - 1)", lambda x: np.tanh(2 * x - 1), lambda x: torch.tanh(2 * x - 1)),
]

WIDE_H = 0.05  # a step large enough that the formula's own error shows: an h that is ignored gets caught


def _central_differences(f, x, h):
    """Every partial derivative of f at x at once: f at x plus and minus h times each unit vector, on
    copies of x (the oracle for a step h; x is left alone)."""
    units = np.eye(x.size).reshape((x.size,) + x.shape)
    ups = np.array([f(x + h * e) for e in units])
    downs = np.array([f(x - h * e) for e in units])
    return ((ups - downs) / (2 * h)).reshape(x.shape)


def _worst_relative(g, n):
    """max |g - n| / max(|g| + |n|, 1e-12), in PyTorch float64 (the oracle of gradient_check)."""
    g, n = torch.as_tensor(np.asarray(g, dtype=np.float64)), torch.as_tensor(np.asarray(n, dtype=np.float64))
    return float(((g - n).abs() / (g.abs() + n.abs()).clamp(min=1e-12)).max())


# ---- the checks ----------------------------------------------------------------------------

def _torch_derivative(tf, x):
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tf(t).backward()
    return t.grad.item()


@exercise
def numerical_derivative(your_numerical_derivative):
    """Central difference f'(x) ~ (f(x+h) - f(x-h)) / 2h against PyTorch's exact derivative,
    and, with a wide step h, against the formula itself (so that h must be used)."""
    n = 0
    for desc, f, tf in _FUNCS:
        for x in rng().uniform(-2, 2, size=3):
            x = float(x)
            h = 1e-5
            yours = your_numerical_derivative(f, x)
            expected = _torch_derivative(tf, x)
            forward = (f(x + h) - f(x)) / h
            assert_close(yours, expected, what=f"the derivative of f(x) = {desc} at x = {x:.6f}",
                         rtol=1e-7, atol=1e-8,
                         mistakes={"that is the one-sided difference, from x to x+h only: step to both "
                                   "sides of x, by h each way": forward,
                                   "twice the derivative: the two points are 2h apart, divide by that": 2 * expected,
                                   "half the derivative: the two points are 2h apart, not 4h": expected / 2})
            n += 1
        # A wide step, drawn on every run: the answer must depend on h as the formula says.
        x = float(rng().uniform(-2, 2))
        yours = your_numerical_derivative(f, x, WIDE_H)
        expected = float(_central_differences(lambda v: f(float(v[0])), np.array([x]), WIDE_H)[0])
        assert_close(yours, expected, what=f"the central difference of f(x) = {desc} at x = {x:.6f} with h = {WIDE_H}",
                     rtol=1e-9, atol=1e-12,
                     mistakes={"your function ignores its argument h: use the h it is given, not a fixed step":
                               your_numerical_derivative(f, x)},
                     hint="with a wide step the estimate differs from the exact derivative; the check compares "
                          "with the formula at that same h.")
        n += 1
    return f"{n} random points on {len(_FUNCS)} functions, one with a wide step h"


def _vector_fn(rng_, shape):
    """A random smooth function of an array, as a numpy and a torch version."""
    a = rng_.uniform(-1, 1, size=shape)
    c = float(rng_.uniform(0.5, 2))
    f = lambda x: float(np.sum(np.sin(c * x) * a) + np.sum(x**2 * a) ** 2 / 4)
    tf = lambda x: torch.sum(torch.sin(c * x) * torch.tensor(a)) + torch.sum(x**2 * torch.tensor(a)) ** 2 / 4
    return f, tf


def _require_unchanged(x, x_before):
    require(np.array_equal(x, x_before),
            f"your function changed its input x (first change at index "
            f"{tuple(int(i) for i in np.argwhere(x != x_before)[0]) if (x != x_before).any() else '?'}).",
            hint="after nudging x[i] by +h and -h, put the original value back.")


@exercise
def numerical_gradient(your_numerical_gradient):
    """The gradient of f: R^shape -> R by central differences, one element at a time."""
    shapes = [(int(rng().integers(2, 8)),), (3, 5), (2, 3, 4)]
    for shape in shapes:
        f, tf = _vector_fn(rng(), shape)
        x = rng().uniform(-1.5, 1.5, size=shape)
        x_before = x.copy()
        yours = your_numerical_gradient(f, x)
        _require_unchanged(x, x_before)
        t = torch.tensor(x, requires_grad=True)
        tf(t).backward()
        assert_close(yours, t.grad.numpy(), what=f"the gradient for an input of shape {shape}",
                     rtol=1e-6, atol=1e-7, inputs={"x": x},
                     hint="nudge one element at a time (np.ndindex walks every index) and keep the other elements fixed.")
    # A wide step, drawn on every run: the answer must depend on h.
    shape = (2, int(rng().integers(2, 5)))
    f, _ = _vector_fn(rng(), shape)
    x = rng().uniform(-1.5, 1.5, size=shape)
    expected = _central_differences(f, x.copy(), WIDE_H)
    x_before = x.copy()
    yours = your_numerical_gradient(f, x, WIDE_H)
    _require_unchanged(x, x_before)
    assert_close(yours, expected, what=f"the gradient for an input of shape {shape} with h = {WIDE_H}",
                 rtol=1e-9, atol=1e-12, inputs={"x": x},
                 mistakes={"your function ignores its argument h: use the h it is given, not a fixed step":
                           _central_differences(f, x.copy(), 1e-5)})
    return "3 random functions of 1-D, 2-D and 3-D inputs, and one with a wide step h"


@exercise
def gradient_check(your_gradient_check, your_numerical_gradient):
    """max_i |g_i - n_i| / max(|g_i| + |n_i|, 1e-12) with n the numerical gradient."""
    shape = (3, int(rng().integers(3, 7)))
    f, tf = _vector_fn(rng(), shape)
    x = rng().uniform(-1.5, 1.5, size=shape)

    def true_grad(x):
        t = torch.tensor(x, requires_grad=True)
        tf(t).backward()
        return t.grad.numpy()

    # gradient_check is built on numerical_gradient: make sure that one is right first.
    mine = your_numerical_gradient(f, x.copy())
    assert_close(mine, true_grad(x), what="your numerical_gradient (which gradient_check uses)", rtol=1e-6, atol=1e-7,
                 hint="fix numerical_gradient first: its check, just above, tells you how.")

    good = your_gradient_check(f, true_grad, x)
    require(np.ndim(good) == 0, f"gradient_check should return one number (the worst element), got {fmt(good)}.",
            hint="take the max over all elements.")
    require(0 <= float(good) < 1e-6,
            f"a correct gradient should give a tiny relative error (below 1e-6); yours says {fmt(float(good))}.",
            hint="compare grad_f(x) with numerical_gradient(f, x), elementwise.")
    # Gradients with planted bugs: the error must reflect them, and be exactly the formula.
    i = tuple(int(v) for v in rng().integers(0, shape))
    at_i = np.arange(x.size).reshape(x.shape) == np.ravel_multi_index(i, x.shape)
    one_wrong = lambda x: true_grad(x) + np.where(at_i, 0.3, 0.0)
    for name, buggy in [("a gradient wrong in one element", one_wrong),
                        ("a gradient with the wrong sign", lambda x: -true_grad(x)),
                        ("a gradient scaled by 3", lambda x: 3 * true_grad(x))]:
        yours = your_gradient_check(f, buggy, x)
        expected = _worst_relative(buggy(x), true_grad(x))
        g, n = buggy(x), true_grad(x)
        assert_close(yours, expected, what=f"the relative error for {name}", rtol=1e-4, atol=1e-9,
                     mistakes={"that is the mean over elements; report the max (the worst element)":
                               float(np.mean(np.abs(g - n) / np.maximum(np.abs(g) + np.abs(n), 1e-12))),
                               "that is the absolute error; divide by |g| + |n|": float(np.max(np.abs(g - n))),
                               "take the absolute value of g - n (and of g and n in the denominator)":
                               float(np.max((g - n) / np.maximum(g + n, 1e-12)))})
    # A correct gradient with a wide step h, drawn on every run: the numerical gradient's own
    # error now shows, so an h that is not passed on to numerical_gradient gets caught.
    yours = your_gradient_check(f, true_grad, x, WIDE_H)
    expected = _worst_relative(true_grad(x), your_numerical_gradient(f, x.copy(), WIDE_H))
    assert_close(yours, expected, what=f"the relative error of a correct gradient with h = {WIDE_H}",
                 rtol=1e-6, atol=1e-12,
                 mistakes={"your gradient_check ignores its argument h: pass it on to numerical_gradient":
                           _worst_relative(true_grad(x), your_numerical_gradient(f, x.copy()))})
    return "a correct gradient, 3 planted bugs and a wide step h"
