"""What the backends built from your chapter 06 and 07 kernels share: how one is built and registered,
the one line that says whose kernel runs each op, and the batch of matrix pairs your 2-D matmul kernels
multiply."""

import collections

import numpy as np

from course_lib import yours
from course_lib.tensor.backend import Backend, get_backend, register_backend
from course_lib.tensor.broadcast import shape_broadcast


class BackendOfYours(Backend):
    """A backend that runs your kernels where they are given, and hands the rest to `course`.

    kernels: {piece name: your function} (a kernel you have not saved: None or absent).
    course: the course's backend, which serves every call none of your kernels does."""

    def __init__(self, kernels, course):
        self.kernels = {k: v for k, v in kernels.items() if v is not None}
        self.course = course
        self.calls = collections.Counter()  # how many times each of your kernels ran

    def whose(self):
        """[(op, the name of your kernel that runs it, or None where the course's kernel does)]."""
        raise NotImplementedError


def build(chapter, name, backend_class, course, pieces, verify=True, quiet=False):
    """backend_class(your kernels, the course's backend `course`) on your saved chapter kernels (each
    checked again first), registered as `name`. A saved kernel that fails its check raises CheckFailed
    naming it; a kernel you have not saved is None, and the course's backend serves its op."""
    kernels = yours.pieces(chapter, dict.fromkeys(pieces), verify=verify, quiet=True)
    backend = backend_class(kernels, get_backend(course))
    register_backend(name, backend)
    if not quiet:
        print(describe(chapter, name, backend.whose()))
    return backend


def describe(chapter, name, whose):
    """The one line. whose: [(op, your kernel's name, or None where the course's kernel runs it)]."""
    mine = [f"your {kernel} runs {op}" for op, kernel in whose if kernel]
    course = [op for op, kernel in whose if not kernel]
    yours_part = "; ".join(mine) if mine else f"none of your kernels (none saved, or yours.use(\"{chapter}\", False))"
    return f"chapter {chapter} backend {name!r}: {yours_part}; the course's kernels run {', '.join(course)}"


def matrix_pairs(a, b):
    """a (..., n, k) and b (..., k, m) as two stacks of matrices, A (batch, n, k) and B (batch, k, m),
    with the batch dims broadcast; returns (A, B, the broadcast batch shape)."""
    (n, k), m = a.shape[-2:], b.shape[-1]
    batch = shape_broadcast(a.shape[:-2], b.shape[:-2])
    A = np.broadcast_to(a.to_numpy(), batch + (n, k)).reshape(-1, n, k)
    B = np.broadcast_to(b.to_numpy(), batch + (k, m)).reshape(-1, k, m)
    return A, B, batch
