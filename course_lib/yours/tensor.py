"""Chapter 02 assembled from your pieces: a digits MLP that trains on your code.

    from course_lib.yours import tensor
    result = tensor.train_digits()      # {"accuracy", "seconds_per_epoch", "losses"}

What runs the training: your `Linear` (its init and forward), your `matmul_backward` (the backward
of every `@`), your `log_softmax` and `cross_entropy` (the loss), and your `adam_step` (every update;
or your `sgd_momentum_step`).
Your strided zip and reduce are Python loops, thousands of times slower than numpy, too slow to
train with; `first_layer` runs them at a useful size instead: your `Tensor`, `Mul` and `Sum` compute
the first layer of a batch and its gradient, which must match numpy's.
"""

import contextlib
import time

import numpy as np

import course_lib.tensor as ct
from course_lib import yours
from course_lib.tensor import functions as F
from course_lib.tensor import nn, optim
from course_lib.tensor.autodiff import Context, Function
from course_lib.tensor.backend import current_backend
from course_lib.tensor.broadcast import shape_broadcast
from course_lib.tensor.tensor_data import TensorData

# ---- the course's version of each piece, used where yours is not saved -------------------

_COURSE_MATMUL = F.MatMul  # the library's own; train_digits runs yours in its place, through the op registry

def _course_matmul_backward(a, b, grad):
    ctx = Context("MatMul", (True, True))
    ctx.save_for_backward(ct.Tensor(a), ct.Tensor(b))
    return tuple(g.numpy() for g in _COURSE_MATMUL.backward(ctx, ct.Tensor(grad)))


def _course_adam_step(p, g, m, v, t, lr, b1, b2, eps):
    state = {"t": t - 1, "m": ct.Tensor(m), "v": ct.Tensor(v)}
    p = optim.Adam([], lr, (b1, b2), eps).update(ct.Tensor(p), ct.Tensor(g), state)
    return p.numpy(), state["m"].numpy(), state["v"].numpy()


def _course_sgd_momentum_step(p, g, v, lr, momentum):
    state = {"v": ct.Tensor(v)}
    p = optim.SGD([], lr, momentum).update(ct.Tensor(p), ct.Tensor(g), state)
    return p.numpy(), state["v"].numpy()


COURSE = {
    "broadcast_shape": shape_broadcast,
    "strided_zip": None,  # only your Tensor calls it, through your Mul
    "strided_reduce": None,  # only your Tensor calls it, through your Sum
    "Mul": F.Mul, "Sum": F.Sum, "Tensor": ct.Tensor,
    "matmul_backward": _course_matmul_backward,
    "log_softmax": lambda x: ct.Tensor(x).log_softmax(-1).numpy(),
    "cross_entropy": lambda logits, target: ct.cross_entropy(ct.Tensor(logits), target).item(),
    "Linear": nn.Linear,
    "sgd_momentum_step": _course_sgd_momentum_step,
    "adam_step": _course_adam_step,
}


# ---- the parts of the MLP, each built around one of your pieces ---------------------------

class MatMulWithYourBackward(Function):
    """a @ b on the current backend; the backward is `matmul_backward` (yours), set by the subclass
    an assembly makes (`Parts`)."""

    matmul_backward = None

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return current_backend().matmul(a.data, b.data)

    @classmethod
    def backward(cls, ctx, grad):
        a, b = ctx.saved_tensors
        ga, gb = cls.matmul_backward(a.numpy(), b.numpy(), grad.numpy())
        return ct.Tensor(ga, dtype=a.dtype), ct.Tensor(gb, dtype=b.dtype)


class CrossEntropyOfYours(Function):
    """Your cross_entropy; backward: (softmax - one_hot) / batch, softmax = exp(your log_softmax).
    `log_softmax` and `cross_entropy` are set by the subclass an assembly makes (`Parts`)."""

    log_softmax = cross_entropy = None

    @classmethod
    def forward(cls, ctx, logits, target):
        x = logits.numpy()
        ctx.probs, ctx.target = np.exp(cls.log_softmax(x)), target
        return TensorData.from_numpy(cls.cross_entropy(x, target), x.dtype)

    @staticmethod
    def backward(ctx, grad):
        g = ctx.probs.copy()
        g[np.arange(len(ctx.target)), ctx.target] -= 1
        return grad * ct.Tensor(g / len(ctx.target), dtype=grad.dtype)


def _with(function, name, **pieces):
    """`function` with its pieces filled in: a subclass named `name` that holds them."""
    return type(name, (function,), {k: staticmethod(f) for k, f in pieces.items()})


class AdamOfYours(optim.Adam):
    """The course's Adam, whose update is your adam_step."""

    def __init__(self, params, adam_step, **options):
        super().__init__(params, **options)
        self.adam_step = adam_step

    def update(self, param, grad, state):
        t = state["t"] = state.get("t", 0) + 1
        zeros = np.zeros(param.shape, param.dtype)
        new, state["m"], state["v"] = self.adam_step(param.numpy(), grad.numpy(), state.get("m", zeros),
                                                     state.get("v", zeros), t, self.lr, *self.betas, self.eps)
        return ct.Tensor(new, dtype=param.dtype)


class SGDOfYours(optim.SGD):
    """The course's SGD with momentum, whose update is your sgd_momentum_step."""

    def __init__(self, params, sgd_momentum_step, **options):
        super().__init__(params, **options)
        self.sgd_momentum_step = sgd_momentum_step

    def update(self, param, grad, state):
        v = state.get("v", np.zeros(param.shape, param.dtype))
        new, state["v"] = self.sgd_momentum_step(param.numpy(), grad.numpy(), v, self.lr, self.momentum)
        return ct.Tensor(new, dtype=param.dtype)


class Parts:
    """Your chapter 02 pieces (the course's where yours are not saved) as the parts of an MLP."""

    def __init__(self, pieces):
        self.pieces = pieces
        self.Linear, self.Tensor = pieces["Linear"], pieces["Tensor"]
        self.MatMul = _with(MatMulWithYourBackward, "MatMul", matmul_backward=pieces["matmul_backward"])
        self.CrossEntropy = _with(CrossEntropyOfYours, "CrossEntropy", log_softmax=pieces["log_softmax"],
                                  cross_entropy=pieces["cross_entropy"])

    def cross_entropy(self, logits, target):
        return self.CrossEntropy.apply(logits, target=np.asarray(target))

    def Adam(self, params, **options):
        return AdamOfYours(params, self.pieces["adam_step"], **options)

    def SGD(self, params, **options):
        return SGDOfYours(params, self.pieces["sgd_momentum_step"], **options)


def assemble(quiet=False):
    """Your chapter 02 pieces (the course's where yours are not saved) as the parts of an MLP."""
    return Parts(yours.pieces("02", reference=COURSE, quiet=quiet))


@contextlib.contextmanager
def matmul_is(MatMul):
    """Inside the block, every `a @ b` of the library runs `MatMul` (your backward): the library's op
    registry (course_lib/tensor/registry.py) holds it under "MatMul" for the block."""
    with ct.use_ops(MatMul=MatMul):
        yield


def first_layer(parts, x, layer):
    """x @ W.T computed by your Tensor as a broadcast product and a sum (your zip, reduce, Mul, Sum),
    with the gradient of its sum with respect to W; returns the worst difference from numpy's."""
    W = layer.weight.numpy()
    w = ct.Tensor(W.T[None], requires_grad=True)               # (1, in, out)
    out = parts.Tensor.sum(parts.Tensor(x[:, :, None]) * w, dim=1)  # (batch, in, out) summed over in
    parts.Tensor.sum(out).backward()
    return max(np.abs(out.numpy() - x @ W.T).max(), np.abs(w.grad.numpy()[0] - x.sum(0)[:, None]).max())


def train_digits(parts=None, backend="numpy", epochs=10, seed=0, quiet=False, hidden=64, lr=0.01, optimizer="adam"):
    """Train a 64-hidden-10 MLP on the 8x8 digits with your pieces, on the named tensor backend.

    parts: from `assemble()` (the default). optimizer: "adam" (your adam_step) or "sgd" (your
    sgd_momentum_step, momentum 0.9). The forward products run on `backend`; the backward's products
    run in numpy, since your matmul_backward is a numpy function.
    Returns {"accuracy": test accuracy, "seconds_per_epoch": float, "losses": one per step}.
    """
    from course_lib.data import load_digits

    parts = parts or assemble(quiet=quiet)
    X_train, X_test, y_train, y_test = load_digits()
    ct.manual_seed(seed)
    model = nn.Sequential(parts.Linear(64, hidden), nn.ReLU(), parts.Linear(hidden, 10))
    opt = parts.Adam(model.parameters(), lr=lr) if optimizer == "adam" else parts.SGD(
        model.parameters(), lr=lr, momentum=0.9)
    losses, start = [], time.perf_counter()
    with ct.use_backend(backend), matmul_is(parts.MatMul):
        for epoch in range(epochs):
            for xb, yb in ct.DataLoader(X_train, y_train, batch_size=64, seed=seed + epoch):
                loss = parts.cross_entropy(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
        seconds = (time.perf_counter() - start) / epochs
        with ct.no_grad():
            accuracy = float((model(ct.Tensor(X_test)).numpy().argmax(1) == y_test).mean())
    return {"accuracy": accuracy, "seconds_per_epoch": seconds, "losses": losses}
