"""Chapter 00's checks pass on the reference and reject plausible mistakes."""

import numpy as np
import pytest
from checking import expect_failure

from course_lib import gradcheck
from course_lib.checks import ch00 as check


def central(f, x, h=1e-5):
    return (f(x + h) - f(x - h)) / (2 * h)


def gradient(f, x, h=1e-5):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + h
        up = f(x)
        x[i] = old - h
        down = f(x)
        x[i] = old
        g[i] = (up - down) / (2 * h)
    return g


def grad_check(f, grad_f, x, h=1e-5):
    g, n = grad_f(x), gradient(f, x, h)
    return float(np.max(np.abs(g - n) / np.maximum(np.abs(g) + np.abs(n), 1e-12)))


def test_reference_passes(capsys):
    check.numerical_derivative(central)
    check.numerical_gradient(gradient)
    check.gradient_check(grad_check, gradient)
    assert capsys.readouterr().out.count("passed") == 3


@pytest.mark.parametrize("wrong, hint", [
    (lambda f, x, h=1e-5: (f(x + h) - f(x)) / h, "one-sided"),
    (lambda f, x, h=1e-5: (f(x + h) - f(x - h)) / h, "2h apart, divide by that"),
    (lambda f, x, h=1e-5: (f(x + h) - f(x - h)) / (4 * h), "half the derivative"),
    (lambda f, x, h=1e-5: None, "forget a `return`"),
])
def test_numerical_derivative_rejects(wrong, hint):
    expect_failure(check.numerical_derivative, wrong, match=hint)


def no_restore(f, x, h=1e-5):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        x[i] += h
        up = f(x)
        x[i] -= 2 * h
        g[i] = (up - f(x)) / (2 * h)
    return g


def first_element_only(f, x, h=1e-5):
    g = np.zeros_like(x)
    e = np.zeros_like(x)
    e.flat[0] = h
    g.flat[0] = (f(x + e) - f(x - e)) / (2 * h)
    return g


def flattened(f, x, h=1e-5):
    return gradient(f, x, h).ravel()


def nudges_everything(f, x, h=1e-5):
    return np.full_like(x, (f(x + h) - f(x - h)) / (2 * h))


@pytest.mark.parametrize("wrong, hint", [(no_restore, "changed its input"), (first_element_only, "differs"),
                                         (flattened, "wrong shape"), (nudges_everything, "differs")])
def test_numerical_gradient_rejects(wrong, hint):
    expect_failure(check.numerical_gradient, wrong, match=hint)


def mean_error(f, grad_f, x, h=1e-5):
    g, n = grad_f(x), gradient(f, x, h)
    return float(np.mean(np.abs(g - n) / np.maximum(np.abs(g) + np.abs(n), 1e-12)))


def absolute_error(f, grad_f, x, h=1e-5):
    return float(np.max(np.abs(grad_f(x) - gradient(f, x, h))))


def elementwise(f, grad_f, x, h=1e-5):
    g, n = grad_f(x), gradient(f, x, h)
    return np.abs(g - n) / np.maximum(np.abs(g) + np.abs(n), 1e-12)


@pytest.mark.parametrize("wrong, hint", [(mean_error, "mean"), (absolute_error, "absolute error"),
                                         (elementwise, "one number")])
def test_gradient_check_rejects(wrong, hint):
    expect_failure(check.gradient_check, wrong, gradient, match=hint)


def test_stub_is_reported_as_not_implemented():
    def stub(f, x, h=1e-5):
        raise NotImplementedError("Exercise: replace this line with your code")

    expect_failure(check.numerical_derivative, stub, match="not implemented yet")


# ---- the step h is drawn wide on every run: an implementation that ignores it fails -------

def central_fixed_h(f, x, h=1e-5):
    return (f(x + 1e-5) - f(x - 1e-5)) / (2e-5)


def gradient_fixed_h(f, x, h=1e-5):
    return gradient(f, x)


def grad_check_fixed_h(f, grad_f, x, h=1e-5):
    return grad_check(f, grad_f, x)


def test_numerical_derivative_must_use_h():
    expect_failure(check.numerical_derivative, central_fixed_h, match="ignores its argument h")


def test_numerical_gradient_must_use_h():
    expect_failure(check.numerical_gradient, gradient_fixed_h, match="ignores its argument h")


def test_gradient_check_must_pass_h_on():
    expect_failure(check.gradient_check, grad_check_fixed_h, gradient, match="ignores its argument h")


def test_gradient_check_uses_the_given_numerical_gradient():
    expect_failure(check.gradient_check, grad_check, first_element_only, match="fix numerical_gradient first")


def test_reference_tools_agree_with_the_exercises():
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, size=(2, 3))
    f = lambda x: float(np.sum(np.sin(x) * x))
    assert np.allclose(gradcheck.numerical_gradient(f, x.copy()), gradient(f, x.copy()))
    assert gradcheck.gradient_check(f, lambda x: np.sin(x) + x * np.cos(x), x) < 1e-8
    assert gradcheck.gradient_check(f, lambda x: np.sin(x), x) > 0.1
    assert gradcheck.numerical_derivative(np.sin, 0.3) == pytest.approx(np.cos(0.3), rel=1e-9)
