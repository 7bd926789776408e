"""Chapter 02's checks pass on the reference and reject the usual mistakes."""

import operator

import numpy as np
from checking import expect_failure

import course_lib.tensor as ct
from course_lib.checks import ch02 as check
from course_lib.tensor import nn
from course_lib.tensor.autodiff import Function
from course_lib.tensor.functions import unbroadcast
from course_lib.tensor.tensor_data import TensorData, index_to_position, to_index

# ------------------------------------------------------------------ references

def broadcast(a, b):
    return tuple(np.broadcast_shapes(a, b))


def input_index(out_index, shape, right_aligned=True):
    extra = len(out_index) - len(shape) if right_aligned else 0
    return [0 if n == 1 else out_index[extra + d] for d, n in enumerate(shape)]


def zip_(f, a, b, right_aligned=True, offsets=True, strided=True, swap=False, dtype=None):
    shape = broadcast(a.shape, b.shape)
    out = TensorData.zeros(shape, dtype or np.result_type(a.dtype, b.dtype))
    index = [0] * len(shape)
    for ordinal in range(out.size):
        to_index(ordinal, shape, index)
        vals = []
        for t in (a, b):
            i = input_index(index, t.shape, right_aligned)
            strides = t.strides if strided else TensorData.zeros(t.shape).strides
            vals.append(t.storage[index_to_position(i, strides, t.offset if offsets else 0)])
        out.storage[ordinal] = f(vals[1], vals[0]) if swap else f(vals[0], vals[1])
    return out


def reduce_(f, start, a, dim, keepdim=True, use_start=True, reverse=False, wrong_dim=False, strided=True):
    if wrong_dim:
        dim = (dim + 1) % a.dims
    shape = a.shape[:dim] + (1,) + a.shape[dim + 1:]
    out = TensorData.zeros(shape, a.dtype)
    index = [0] * a.dims
    strides = a.strides if strided else TensorData.zeros(a.shape).strides
    for ordinal in range(out.size):
        to_index(ordinal, shape, index)
        ks = list(range(a.shape[dim]))[::-1] if reverse else range(a.shape[dim])
        acc = start if use_start else None
        for k in ks:
            index[dim] = k
            x = a.storage[index_to_position(index, strides, a.offset)]
            acc = x if acc is None else f(acc, x)
        out.storage[ordinal] = acc
    if not keepdim:
        return out.view(a.shape[:dim] + a.shape[dim + 1:])
    return out


def make_mul(unbroadcast_grads=True, swap=False, returns_tensor=False):
    class Mul(Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            out = zip_(operator.mul, a.data, b.data)
            return ct.Tensor(out) if returns_tensor else out

        @staticmethod
        def backward(ctx, grad):
            a, b = ctx.saved_tensors
            ga, gb = (grad * a, grad * b) if swap else (grad * b, grad * a)
            if not unbroadcast_grads:
                return ga, gb
            return unbroadcast(ga, a.shape), unbroadcast(gb, b.shape)
    return Mul


def make_sum(expand=True, mean=False, wrong_dim=False):
    class Sum(Function):
        @staticmethod
        def forward(ctx, a, dim):
            ctx.shape = a.shape
            return reduce_(operator.add, 0.0, a.data, dim, wrong_dim=wrong_dim)

        @staticmethod
        def backward(ctx, grad):
            g = grad.expand(ctx.shape) if expand else grad
            return g / float(ctx.shape[0]) if mean else g
    return Sum


Mul, Sum = make_mul(), make_sum()


def make_tensor(mul=Mul, sum_fn=Sum, lift=True, reshape=True, all_dims=True, negative=True):
    class Tensor(ct.Tensor):
        def __mul__(self, other):
            return mul.apply(self, self._lift(other) if lift else other)

        def __rmul__(self, other):
            return mul.apply(self._lift(other), self)

        def sum(self, dim=None, keepdim=False):
            if dim is None:
                dims = range(self.ndim) if all_dims else [0]
            else:
                dims = [dim % self.ndim if negative else dim]
            out = self
            for d in dims:
                out = sum_fn.apply(out, dim=d)
            if not keepdim and reshape:
                out = out.reshape(tuple(n for d, n in enumerate(self.shape) if d not in dims))
            return out
    return Tensor


def matmul_bw(a, b, g):
    return g @ np.swapaxes(b, -1, -2), np.swapaxes(a, -1, -2) @ g


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


def test_reference_passes(capsys):
    check.broadcast_shape(broadcast)
    check.strided_zip(zip_)
    check.strided_reduce(reduce_)
    check.mul_function(Mul)
    check.sum_function(Sum)
    check.tensor_methods(make_tensor())
    check.matmul_backward(matmul_bw)
    check.softmax_cross_entropy(log_softmax, ce)
    check.linear(Linear)
    check.optimizer_steps(sgd, adam)
    assert capsys.readouterr().out.count("passed") == 10


def test_broadcast_shape_rejects():
    def left_aligned(a, b):
        return tuple(max(x, y) for x, y in zip(a, b))

    def never_raises(a, b):
        n = max(len(a), len(b))
        a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
        return tuple(max(x, y) for x, y in zip(a, b))

    expect_failure(check.broadcast_shape, left_aligned)
    expect_failure(check.broadcast_shape, never_raises, match="do not broadcast")


def test_strided_zip_rejects():
    # broadcasting aligned on the left instead of the right: the wrong element, or out of range
    expect_failure(check.strided_zip, lambda f, a, b: zip_(f, a, b, right_aligned=False))
    expect_failure(check.strided_zip, lambda f, a, b: zip_(f, a, b, offsets=False), match="offset")
    expect_failure(check.strided_zip, lambda f, a, b: zip_(f, a, b, strided=False))
    expect_failure(check.strided_zip, lambda f, a, b: zip_(f, a, b, swap=True), match="swapped")
    expect_failure(check.strided_zip, lambda f, a, b: zip_(f, a, b, dtype=np.float64), match="dtype")


def test_strided_reduce_rejects():
    expect_failure(check.strided_reduce, lambda f, s, a, d: reduce_(f, s, a, d, keepdim=False), match="keepdim")
    expect_failure(check.strided_reduce, lambda f, s, a, d: reduce_(f, s, a, d, wrong_dim=True))
    expect_failure(check.strided_reduce, lambda f, s, a, d: reduce_(f, s, a, d, reverse=True), match="in order")
    expect_failure(check.strided_reduce, lambda f, s, a, d: reduce_(f, s, a, d, use_start=False), match="start")
    expect_failure(check.strided_reduce, lambda f, s, a, d: reduce_(f, s, a, d, strided=False))


def test_mul_function_rejects():
    expect_failure(check.mul_function, make_mul(unbroadcast_grads=False), match="sum it back")
    expect_failure(check.mul_function, make_mul(swap=True), match="OTHER operand")
    expect_failure(check.mul_function, make_mul(returns_tensor=True), match="raw TensorData")


def test_sum_function_rejects():
    expect_failure(check.sum_function, make_sum(expand=False))
    expect_failure(check.sum_function, make_sum(mean=True))
    expect_failure(check.sum_function, make_sum(wrong_dim=True))


def test_tensor_methods_rejects():
    expect_failure(check.tensor_methods, make_tensor(reshape=False), match="shape")
    expect_failure(check.tensor_methods, make_tensor(all_dims=False), match="dim=None")
    expect_failure(check.tensor_methods, make_tensor(lift=False))
    expect_failure(check.tensor_methods, make_tensor(negative=False))
    from course_lib.tensor import functions as F
    expect_failure(check.tensor_methods, make_tensor(mul=F.Mul), match="your Mul")
    expect_failure(check.tensor_methods, make_tensor(mul=make_mul(swap=True)))


def test_matmul_backward_rejects():
    expect_failure(check.matmul_backward, lambda a, b, g: (g @ b, a @ g) if a.shape[-1] == b.shape[-1] else matmul_bw(a, b, g),
                   match="missing transpose")
    expect_failure(check.matmul_backward, lambda a, b, g: (np.swapaxes(b, -1, -2) @ g, g @ np.swapaxes(a, -1, -2)))
    expect_failure(check.matmul_backward, lambda a, b, g: (g @ b.T, a.T @ g))  # .T breaks the batched case


def test_softmax_cross_entropy_rejects():
    def unstable(x):
        return np.log(np.exp(x) / np.exp(x).sum(-1, keepdims=True))

    expect_failure(check.softmax_cross_entropy, unstable, ce, match="unstable")

    def batch_max(x):  # stable for one row, but one max for the whole batch underflows far rows
        m = x.max()
        return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))

    expect_failure(check.softmax_cross_entropy, batch_max, ce)  # the fixed rows-apart case always catches it
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

    expect_failure(check.linear, NormalInit, match="sqrt(in)")

    class ZeroBias(Linear):
        def __init__(self, i, o):
            super().__init__(i, o)
            self.bias = nn.Parameter(np.zeros(o), dtype=np.float32)

    expect_failure(check.linear, ZeroBias, match="all zeros")

    class HalfUniform(Linear):
        def __init__(self, i, o):
            super().__init__(i, o)
            b = 1 / np.sqrt(i)
            self.weight = nn.Parameter(ct.generator().uniform(0, b, (o, i)), dtype=np.float32)

    expect_failure(check.linear, HalfUniform, match="negative")

    class WrongBound(Linear):
        def __init__(self, i, o):
            super().__init__(i, o)
            b = 1 / np.sqrt(o)
            self.weight = nn.Parameter(ct.generator().uniform(-b, b, (o, i)), dtype=np.float32)
            self.bias = nn.Parameter(ct.generator().uniform(-b, b, (o,)), dtype=np.float32)

    expect_failure(check.linear, WrongBound, match="sqrt(in)")

    class SmallBias(Linear):
        def __init__(self, i, o):
            super().__init__(i, o)
            b = 1 / i
            self.bias = nn.Parameter(ct.generator().uniform(-b, b, (o,)), dtype=np.float32)

    expect_failure(check.linear, SmallBias, match="bias")


def test_optimizer_steps_rejects():
    expect_failure(check.optimizer_steps, lambda p, g, v, lr, m: (p - lr * g, v), adam, match="velocity")
    expect_failure(check.optimizer_steps, sgd, lambda *a: adam(*a, correct=False), match="bias correction")
    expect_failure(check.optimizer_steps, lambda p, g, v, lr, m: (p - lr * (m * v + g), v), adam)
