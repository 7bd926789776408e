"""Reverse-mode autodiff over tensors: Function, Context, and the backward pass.

Every op is a `Function` with a `forward` (compute the value, save what the
derivative needs in `ctx`) and a `backward` (given d(loss)/d(output), return
d(loss)/d(input) for each input, summed back to the input's shape by `unbroadcast`
where the op broadcast it). `Function.apply` runs forward and records the
op in the output tensor, so the outputs remember how they were made: that record
is the graph that `backward` walks in reverse topological order.

`op_mode` is the one plug-in point for tools that watch ops as they run (chapter 13's compiler
records a training step through it); with no mode in force it costs one test per op.
"""

from __future__ import annotations

import contextlib

_grad_enabled = [True]
_modes = []  # the op modes in force, innermost last (see op_mode)


def is_grad_enabled() -> bool:
    return _grad_enabled[0]


@contextlib.contextmanager
def no_grad():
    """Ops inside the block record no graph (for evaluation and optimizer steps)."""
    previous = _grad_enabled[0]
    _grad_enabled[0] = False
    try:
        yield
    finally:
        _grad_enabled[0] = previous


@contextlib.contextmanager
def op_mode(mode):
    """Inside the block, every op runs through `mode`, as torch's TorchDispatchMode does:

        Function.apply(...)   calls mode.apply(cls, inputs, kwargs, run), where run() applies the op as usual
        the backward pass     calls mode.backward(cls, ctx, grad, run), where run() calls cls.backward
        Tensor.item, .numpy   call mode.read(tensor) before a value leaves the library for Python

    The mode returns what run() returns. Modes nest: the innermost one sees the ops."""
    _modes.append(mode)
    try:
        yield mode
    finally:
        _modes.remove(mode)


class Context:
    """What forward leaves for backward: saved tensors (checked for in-place changes)."""


    def __init__(self, op: str = "", needs_grad=()):
        self.saved = ()
        self.versions = ()
        self.needs_grad = needs_grad
        self.op = op

    def save_for_backward(self, *tensors):
        self.saved = tensors
        self.versions = tuple(t._version for t in tensors)

    @property
    def saved_tensors(self):
        for i, (t, v) in enumerate(zip(self.saved, self.versions)):
            if t._version != v:
                raise RuntimeError(
                    f"{self.op}.backward: saved tensor {i} (shape {t.shape}) was changed in place "
                    f"after the forward pass (version {v} -> {t._version}); its gradient would be wrong. "
                    f"Use an out-of-place op (x = x + y, not x.add_(y)).")
        return self.saved


class Function:
    """Base class of an op. Subclasses write `forward(ctx, *tensors, **kw) -> TensorData`
    and `backward(ctx, grad) -> one gradient Tensor per tensor input (or None)`."""

    @classmethod
    def apply(cls, *inputs, **kwargs):
        if _modes:
            return _modes[-1].apply(cls, inputs, kwargs, lambda: cls._apply(inputs, kwargs))
        return cls._apply(inputs, kwargs)

    @classmethod
    def _apply(cls, inputs, kwargs):
        """Run forward and, if any input needs a gradient, record the op in the output."""
        needs = tuple(t.requires_grad for t in inputs) if _grad_enabled[0] else ()
        track = True in needs
        ctx = Context(cls.__name__, needs)
        out = inputs[0]._new(cls.forward(ctx, *inputs, **kwargs))  # a Tensor, without importing tensor.py
        if track:
            out.requires_grad = True
            out._ctx = ctx
            out._fn = cls
            out._parents = inputs
        return out

    @staticmethod
    def forward(ctx, *inputs, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError


def unbroadcast(grad, shape):
    """Sum a gradient back to the shape of the operand that was broadcast.

    Broadcasting copies an operand along the new leading dims and its size-1 dims,
    so each copy's gradient must be added up: sum over those dims, then reshape."""
    if grad.shape == tuple(shape):
        return grad
    extra = grad.ndim - len(shape)
    dims = tuple(range(extra)) + tuple(
        extra + i for i, n in enumerate(shape) if n == 1 and grad.shape[extra + i] != 1)
    return grad.sum(dims, keepdim=True).reshape(shape) if dims else grad.reshape(shape)


def topological_order(root) -> list:
    """Tensors that `root` depends on, each after all its inputs (iterative DFS, no recursion)."""
    order, seen = [], set()
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for parent in node._parents:
            if parent.requires_grad and id(parent) not in seen:
                stack.append((parent, False))
    return order


def backward(root, grad, order=topological_order) -> None:
    """Push d(root)/d(root) = grad back through the graph; leaves accumulate `.grad`.

    order(root): the tensors root depends on, each after its inputs (registry.py lets another one in)."""
    grads = {id(root): grad}
    with no_grad():
        for node in reversed(order(root)):
            g = grads.pop(id(node), None)
            if g is None:
                continue
            if node._fn is None or node._retain:  # a leaf, or asked to keep its grad
                node._accumulate(g)
            if node._fn is None:
                continue
            if _modes:
                fn, ctx = node._fn, node._ctx
                in_grads = _modes[-1].backward(fn, ctx, g, lambda: fn.backward(ctx, g))
            else:
                in_grads = node._fn.backward(node._ctx, g)
            if not isinstance(in_grads, tuple):
                in_grads = (in_grads,)
            for parent, pg in zip(node._parents, in_grads):
                if pg is None or not parent.requires_grad:
                    continue
                if pg.shape != parent.shape:
                    raise RuntimeError(
                        f"{node._fn.__name__}.backward returned a gradient of shape {pg.shape} "
                        f"for an input of shape {parent.shape}; sum it back to the input's shape")
                key = id(parent)
                grads[key] = pg if key not in grads else grads[key] + pg
