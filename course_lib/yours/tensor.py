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
from course_lib.tensor.autodiff import Context
from course_lib.tensor.broadcast import shape_broadcast
from course_lib.yours.adapters import (
    AdamOfYours,
    CrossEntropyOfYours,
    MatMulWithYourBackward,
    SGDOfYours,
    pieces_in_force,
)

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


def _course_log_softmax(x):
    return ct.Tensor(x).log_softmax(-1).numpy()


def _course_cross_entropy(logits, target):
    """In numpy: the library's cross_entropy is what this piece computes, inside `Parts.running()`."""
    return -_course_log_softmax(logits)[np.arange(len(target)), target].mean()


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
    "log_softmax": _course_log_softmax,
    "cross_entropy": _course_cross_entropy,
    "Linear": nn.Linear,
    "sgd_momentum_step": _course_sgd_momentum_step,
    "adam_step": _course_adam_step,
}


# ---- the parts of the MLP --------------------------------------------------------------------

class Parts:
    """Your chapter 02 pieces (the course's where yours are not saved) as the parts of an MLP: your `Linear`
    and `Tensor`; inside `running()`, every `@` backpropagated by your matmul_backward and the library's
    cross_entropy computed by your log_softmax and cross_entropy (the adapters of adapters.py)."""

    def __init__(self, pieces):
        self.pieces = pieces
        self.Linear, self.Tensor = pieces["Linear"], pieces["Tensor"]

    @contextlib.contextmanager
    def running(self):
        """Inside the block, the library's `@` and cross_entropy run your pieces (the op registry)."""
        with pieces_in_force(self.pieces), ct.use_ops(MatMul=MatMulWithYourBackward, CrossEntropy=CrossEntropyOfYours):
            yield self

    def Adam(self, params, **options):
        return AdamOfYours(params, self.pieces["adam_step"], **options)

    def SGD(self, params, **options):
        return SGDOfYours(params, self.pieces["sgd_momentum_step"], **options)


def assemble(quiet=False):
    """Your chapter 02 pieces (the course's where yours are not saved) as the parts of an MLP."""
    return Parts(yours.pieces("02", reference=COURSE, quiet=quiet))


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
    with ct.use_backend(backend), parts.running():
        for epoch in range(epochs):
            for xb, yb in ct.DataLoader(X_train, y_train, batch_size=64, seed=seed + epoch):
                loss = ct.cross_entropy(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
        seconds = (time.perf_counter() - start) / epochs
        with ct.no_grad():
            accuracy = float((model(ct.Tensor(X_test)).numpy().argmax(1) == y_test).mean())
    return {"accuracy": accuracy, "seconds_per_epoch": seconds, "losses": losses}
