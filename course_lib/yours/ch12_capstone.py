"""Chapter 12 assembled: chapter 04's GPT trained on your own library, from the scalar loop up.

    from course_lib.yours import ch12_capstone as capstone
    lib = capstone.assemble()                  # checks your saved pieces again; one line says whose run
    model = lib.GPT.from_torch(torch_gpt)      # chapter 04's weights, your attention in every block
    optimizer = lib.configure_optimizer(model, cfg)
    with lib.running():                        # your Functions, your order and your kernels, in the block
        loss = course_lib.capstone.train_step(model, optimizer, x, y)

What runs where, inside `lib.running()`:

    every kernel: elementwise ops, sums, copies, products    your chapter 06 kernels ("yours-numba")
    x * y and .sum()                                          your chapter 02 Mul and Sum
    the backward of every @                                   your chapter 02 matmul_backward
    the loss                                                  your chapter 02 log_softmax, cross_entropy
    every parameter update, after AdamW's decay               your chapter 02 adam_step
    the order loss.backward() walks the graph in              your chapter 01 topological_order
    softmax, GELU, layer norm, embeddings, masked fill        your chapter 12 Functions
    every block's attention                                   your chapter 12 causal_self_attention

A piece you have not saved (or turned off with `yours.use`) is the course's, and `assemble` says so.
The library's own Functions still run the views (reshape, transpose, slices) and add, subtract and
divide; their numbers come from your kernels.

How the pieces get in: through the library's declared plug-in points only. The Functions and the order
go into the op registry (`course_lib.tensor.use_ops`), the kernels are a registered backend
(`use_backend`), the attention is the GPT's `attention` argument, adam_step is the update of an AdamW.
Your chapter 02 Mul and Sum compute with the loops your chapter 02 module names `strided_zip` and
`strided_reduce`, Python loops thousands of times too slow for a GPT. In this assembly's own copy of your
module, those two names are the current backend's zip and reduce, so your Mul runs on your kernels
(chapter 02's digits still run your Python loops).

`measure_step` counts and times one training step by whose code computed it (meter.py).
"""

import collections
import contextlib
import functools
import math
import time
from types import SimpleNamespace

import numpy as np

from course_lib import yours
from course_lib.capstone import model as capstone_model
from course_lib.capstone.train import configure_optimizer as course_optimizer
from course_lib.capstone.train import train_step  # noqa: F401  (the payoff's step, as the course's)
from course_lib.tensor import Function, Tensor, autodiff, optim, scalar_ops, use_backend, use_ops
from course_lib.tensor import functions as F
from course_lib.tensor.backend import current_backend
from course_lib.tensor.functions import unbroadcast
from course_lib.tensor.tensor_data import TensorData
from course_lib.yours import autograd as yours_autograd
from course_lib.yours import numba_backend
from course_lib.yours import tensor as yours_tensor
from course_lib.yours.meter import Meter

# ---- the course's version of each piece, used where yours is not saved --------------------------------


def _course_attention(x, c_attn, c_proj, n_head):
    config = SimpleNamespace(n_embd=x.shape[-1], n_head=n_head, block_size=x.shape[1], dropout=0.0)
    attention = capstone_model.CausalSelfAttention(config, x.dtype)
    attention.c_attn, attention.c_proj = c_attn, c_proj
    return attention(x)


COURSE_12 = {"Softmax": F.Softmax, "GELU": F.GELUTanh, "LayerNorm": F.LayerNorm, "Embedding": F.Embedding,
             "MaskedFill": F.MaskedFill, "causal_self_attention": _course_attention}
REGISTRY_NAME = {"GELU": "GELUTanh"}   # the registry's name of an exercise's Function, where they differ
PIECES_02 = ("Mul", "Sum", "matmul_backward", "log_softmax", "cross_entropy", "adam_step")


# ---- chapter 01: your topological order, walking tensors ----------------------------------------------

class _Node:
    """A tensor as chapter 01's topological_order walks it: `_prev`, its inputs that need a gradient."""

    __slots__ = ("tensor", "_memo")

    def __init__(self, tensor, memo):
        self.tensor, self._memo = tensor, memo

    @property
    def _prev(self):
        return tuple(_node(p, self._memo) for p in self.tensor._parents if p.requires_grad)


def _node(tensor, memo):
    """The one _Node of a tensor within one walk (a shared input is the same node each time)."""
    node = memo.get(id(tensor))
    if node is None:
        node = memo[id(tensor)] = _Node(tensor, memo)
    return node


def tensor_order(topological_order):
    """Your chapter 01 topological_order (on nodes with `_prev`) as the order of a tensor graph."""
    def order(root):
        return [node.tensor for node in topological_order(_node(root, {}))]
    order.__name__ = f"your {topological_order.__name__}"
    return order


# ---- chapter 02: your Mul and Sum on the backend's loops ----------------------------------------------

_PROBES = ((1.5, -2.25), (0.75, 3.5), (-4.0, 0.5), (2.0, 2.0))


@functools.lru_cache(maxsize=64)
def zip_op(f):
    """The backend's name of the binary op `f` computes (operator.mul -> "mul"), found by trying it."""
    for name in ("mul", "add", "sub", "div", "max"):
        if all(math.isclose(f(x, y), scalar_ops.ZIP[name](x, y)) for x, y in _PROBES):
            return name
    raise ValueError(f"your strided_zip was called with {f!r}, which is none of mul, add, sub, div, max")


@functools.lru_cache(maxsize=64)
def reduce_op(f, start):
    """The backend's name of the reduction (f, start): (operator.add, 0.0) -> "sum"."""
    if zip_op(f) == "add" and start == 0:
        return "sum"
    if zip_op(f) == "max" and start == -math.inf:
        return "max"
    raise ValueError(f"your strided_reduce was called with ({f!r}, {start!r}), neither a sum nor a max")


def backend_zip(f, a, b):
    """Your chapter 02 strided_zip(f, a, b), as the current backend's zip."""
    return current_backend().zip(zip_op(f), a, b)


def backend_reduce(f, start, a, dim):
    """Your chapter 02 strided_reduce(f, start, a, dim), as the current backend's reduce."""
    return current_backend().reduce(reduce_op(f, start), a, dim)


def _runs_on_loops(cls, loop):
    """Whether the forward of your Function computes with the loop of that name (as the exercise asks)."""
    forward = cls.__dict__.get("forward")
    code = getattr(getattr(forward, "__func__", forward), "__code__", None)
    return code is not None and loop in code.co_names


# ---- the Functions and classes around the pieces that are not Functions -------------------------------

class Routed:
    """Mixin of the Functions in an assembly: forward and backward run through `lib.run`, which books
    them to whose code they are while `lib.measuring()` is on, and only calls them otherwise."""

    lib, whose, label, inner = None, "course", "", None

    @classmethod
    def forward(cls, ctx, *args, **kwargs):
        return cls.lib.run(cls.whose, f"{cls.label}.forward", cls.inner.forward, ctx, *args, **kwargs)

    @classmethod
    def backward(cls, ctx, grad):
        return cls.lib.run(cls.whose, f"{cls.label}.backward", cls.inner.backward, ctx, grad)


def routed(function, lib, whose, label):
    """A Function that is `function`, run through lib.run (see Routed)."""
    return type(function.__name__, (Routed, function), {"lib": lib, "whose": whose, "label": label, "inner": function})


class MatMulWithYourBackward(F.MatMul):
    """a @ b on the backend (your blas_matmul); the backward is your chapter 02 matmul_backward, in numpy."""

    lib = matmul_backward = None   # set by the assembly's subclass

    @classmethod
    def backward(cls, ctx, grad):
        a, b = ctx.saved_tensors
        ga, gb = cls.lib.run("yours", "matmul_backward", cls.matmul_backward, a.data.to_numpy(), b.data.to_numpy(),
                             grad.data.to_numpy())
        ga = unbroadcast(_wrap(ga, grad.dtype), a.shape) if ctx.needs_grad[0] else None
        gb = unbroadcast(_wrap(gb, grad.dtype), b.shape) if ctx.needs_grad[1] else None
        return ga, gb


class CrossEntropyOfYours(Function):
    """The mean cross-entropy by your chapter 02 cross_entropy, in numpy; backward (softmax - one_hot) / N,
    with the softmax exp(your log_softmax)."""

    lib = log_softmax = cross_entropy = None   # set by the assembly's subclass

    @classmethod
    def forward(cls, ctx, logits, one_hot):
        x = logits.data.to_numpy()
        target = one_hot.data.to_numpy().argmax(-1)
        ctx.log_p = _wrap(cls.lib.run("yours", "log_softmax", cls.log_softmax, x), logits.dtype)
        ctx.one_hot, ctx.n = one_hot, x.shape[0]
        loss = cls.lib.run("yours", "cross_entropy", cls.cross_entropy, x, target)
        return TensorData.from_numpy(loss, logits.dtype).view(())

    @staticmethod
    def backward(ctx, grad):
        return (ctx.log_p.exp() - ctx.one_hot) * (grad / float(ctx.n)), None


def _wrap(array, dtype):
    """A numpy result as a Tensor of `dtype` (no copy when it already is one, contiguous)."""
    array = np.ascontiguousarray(array, dtype=dtype)
    return Tensor._wrap(TensorData.contiguous(array.reshape(-1), tuple(int(n) for n in array.shape)))


class AttentionOfYours(capstone_model.CausalSelfAttention):
    """The course's layers (c_attn, c_proj, dropout); the forward is your causal_self_attention."""

    attend = None   # set by the assembly's subclass

    def forward(self, x):
        return self.resid_dropout(self.attend(x, self.c_attn, self.c_proj, self.n_head))


class GPTWithAttention(capstone_model.GPT):
    """The capstone GPT whose blocks' attention is the class attribute `attention`."""

    attention = capstone_model.CausalSelfAttention

    def __init__(self, config, dtype=np.float32, attention=None):
        super().__init__(config, dtype, attention or type(self).attention)

    @classmethod
    def from_torch(cls, torch_gpt, dtype=None, attention=None):
        return super().from_torch(torch_gpt, dtype, attention or cls.attention)


class AdamWWithYourStep(optim.AdamW):
    """AdamW: the decoupled weight decay (p *= 1 - lr * wd, on the library's ops), then your chapter 02
    adam_step, in numpy, on the flat vector of all parameters."""

    def __init__(self, params, adam_step, lib, lr, betas, eps=1e-8, weight_decay=0.01):
        super().__init__(params, lr, betas, eps, weight_decay)
        self.adam_step, self.lib = adam_step, lib

    def update(self, param, grad, state):
        decay = self.per_element("weight_decay", self.weight_decay, param)
        if decay is not None:
            param = param * (1 - self.lr * decay)
        t = state["t"] = state.get("t", 0) + 1
        if t == 1:
            state["m"], state["v"] = np.zeros(param.shape, param.dtype), np.zeros(param.shape, param.dtype)
        lr = self.lr  # one number, or one per entry (a Tensor) when the groups' lrs differ
        lr = lr.data.to_numpy() if isinstance(lr, Tensor) else lr
        new, state["m"], state["v"] = self.lib.run(
            "yours", "adam_step", self.adam_step, param.data.to_numpy(), grad.data.to_numpy(), state["m"], state["v"],
            t, lr, *self.betas, self.eps)
        return _wrap(new, param.dtype)


# ---- the assembly ---------------------------------------------------------------------------------------

class Capstone:
    """The GPT and its training on an assembly of pieces. functions: {registry name: Function class, or the
    order}; backend: the kernels' backend object; GPT: the model class; adam_step: yours, or None for the
    course's AdamW; mine, course: {chapter: names of the learner's pieces that run, of the course's}."""

    def __init__(self, functions, backend, GPT, adam_step, mine, course):
        self.functions, self.backend, self.GPT, self.adam_step = functions, backend, GPT, adam_step
        self.mine, self.course = mine, course
        self.meter = None

    def run(self, whose, name, fn, *args, **kwargs):
        """fn(*args, **kwargs), booked to (whose, name) while measuring."""
        if self.meter is None:
            return fn(*args, **kwargs)
        return self.meter.leaf(whose, name, fn, *args, **kwargs)

    @contextlib.contextmanager
    def running(self):
        """Inside the block, the library's ops are these Functions and the kernels this backend's."""
        with use_ops(**self.functions), use_backend(self.backend.name):
            yield self

    @contextlib.contextmanager
    def measuring(self):
        """Inside the block, every computing call is booked by owner into the Meter it yields."""
        meter = Meter()
        self.meter = self.backend.meter = meter
        try:
            yield meter
        finally:
            self.meter = self.backend.meter = None

    def configure_optimizer(self, model, cfg):
        """AdamW that decays only matrices (as course_lib.capstone's); your adam_step does the updates."""
        groups = course_optimizer(model, cfg).param_groups
        if self.adam_step is None:
            return optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas))
        return AdamWWithYourStep(groups, self.adam_step, self, lr=cfg.lr, betas=tuple(cfg.betas))

    def whose(self, function):
        """"yours" or "course" for a Function class of the graph."""
        return getattr(function, "whose", "course")

    def line(self):
        """One line: whose pieces run the GPT, chapter by chapter."""
        parts = []
        for chapter in sorted(set(self.mine) | set(self.course)):
            mine, course = self.mine.get(chapter, []), self.course.get(chapter, [])
            if chapter == "06":
                said = [f"your kernels {', '.join(mine)}", f"the course's kernels for {', '.join(course)}"] if mine \
                    else ["the course's kernels (none of yours saved, or yours.use(\"06\", False))"]
            else:
                said = ([f"your {', '.join(mine)}"] if mine else []) + ([f"the course's {', '.join(course)}"] if course else [])
            parts.append(f"chapter {chapter}: {'; '.join(said)}")
        return "whose pieces run the GPT. " + ". ".join(parts) + "."

    def kernels_are_yours(self):
        return bool(self.mine.get("06"))


def assemble(verify=True, quiet=False):
    """Your chapter 01, 02, 06 and 12 pieces (the course's where yours are not saved) as a GPT's library."""
    p12 = yours.pieces("12", reference=COURSE_12, verify=verify, quiet=True)
    p02 = yours.pieces("02", reference={n: yours_tensor.COURSE[n] for n in PIECES_02}, verify=verify, quiet=True)
    p01 = yours.pieces("01", reference={"topological_order": yours_autograd.COURSE["topological_order"]},
                       verify=verify, quiet=True)
    backend = numba_backend.build(verify=verify, quiet=True)

    def is_mine(piece, chapter):
        return getattr(piece, "__module__", None) == f"course_yours_ch{chapter}"

    lib = Capstone({}, backend, None, None, {}, {})
    mine = {"01": [], "02": [], "06": sorted({k for _, k in backend.whose() if k}), "12": []}
    course = {"01": [], "02": [], "06": [op for op, k in backend.whose() if not k], "12": []}

    def take(registry_name, function, chapter, label):
        whose = "yours" if is_mine(function, chapter) else "course"
        lib.functions[registry_name] = routed(function, lib, whose, label)
        (mine if whose == "yours" else course)[chapter].append(label)

    for name in ("Softmax", "GELU", "LayerNorm", "Embedding", "MaskedFill"):
        take(REGISTRY_NAME.get(name, name), p12[name], "12", name)
    for name, loop in (("Mul", "strided_zip"), ("Sum", "strided_reduce")):
        piece = p02[name]
        if is_mine(piece, "02") and not _runs_on_loops(piece, loop):
            piece = getattr(F, name)   # your forward computes with its own loop: too slow for a GPT
        if is_mine(piece, "02"):
            module = piece.forward.__globals__   # this assembly's own copy of your chapter 02 module
            module["strided_zip"], module["strided_reduce"] = backend_zip, backend_reduce
        take(name, piece, "02", name)

    if is_mine(p02["matmul_backward"], "02"):
        lib.functions["MatMul"] = type("MatMul", (MatMulWithYourBackward,), {
            "lib": lib, "whose": "yours", "matmul_backward": staticmethod(p02["matmul_backward"])})
        mine["02"].append("matmul_backward")
    else:
        take("MatMul", F.MatMul, "02", "MatMul")
    if is_mine(p02["log_softmax"], "02") and is_mine(p02["cross_entropy"], "02"):
        lib.functions["CrossEntropy"] = type("CrossEntropy", (CrossEntropyOfYours,), {
            "lib": lib, "whose": "yours", "log_softmax": staticmethod(p02["log_softmax"]),
            "cross_entropy": staticmethod(p02["cross_entropy"])})
        mine["02"] += ["log_softmax", "cross_entropy"]
    else:
        take("CrossEntropy", F.CrossEntropy, "02", "CrossEntropy")
    if is_mine(p02["adam_step"], "02"):
        lib.adam_step = p02["adam_step"]
        mine["02"].append("adam_step")
    else:
        course["02"].append("AdamW")

    order = p01["topological_order"]
    whose = "yours" if is_mine(order, "01") else "course"
    walk = tensor_order(order) if whose == "yours" else autodiff.topological_order
    lib.functions["topological_order"] = lambda root: lib.run(whose, "topological_order", walk, root)
    (mine if whose == "yours" else course)["01"].append("topological_order")

    attention = p12["causal_self_attention"]
    lib.GPT = type("GPT", (GPTWithAttention,), {
        "attention": type("CausalSelfAttention", (AttentionOfYours,), {"attend": staticmethod(attention)})})
    (mine if is_mine(attention, "12") else course)["12"].append("causal_self_attention")
    lib.mine, lib.course = mine, course
    if not quiet:
        print(lib.line())
    return lib


# ---- the payoff's measurements ----------------------------------------------------------------------------

def measure_step(lib, model, optimizer, x, y, grad_clip=1.0):
    """One training step on lib, metered. Returns {"meter", "seconds", "graph": Counter of (whose, op) over
    the forward's graph, "loss"}. The graph is counted between the forward and the backward, untimed."""
    with lib.running(), lib.measuring() as meter:
        start = time.perf_counter()
        _, loss = model(x, y)
        forward = time.perf_counter() - start
        graph = collections.Counter((lib.whose(node._fn), node._fn.__name__)
                                    for node in autodiff.topological_order(loss) if node._fn is not None)
        start = time.perf_counter()
        optimizer.zero_grad()
        loss.backward()
        if grad_clip:
            optim.clip_grad_norm_(optimizer.params, grad_clip)
        optimizer.step()
        seconds = forward + time.perf_counter() - start
    return {"meter": meter, "seconds": seconds, "graph": graph, "loss": loss.item()}


def describe_step(measured):
    """Lines that say how much of the measured step was whose code: calls, time, the graph's nodes."""
    meter, seconds, graph = measured["meter"], measured["seconds"], measured["graph"]
    calls, _ = meter.total()
    mine, my_seconds = meter.total("yours")
    theirs, their_seconds = meter.total("course")

    def listing(whose):
        names = collections.Counter({name: n for (w, name), n in meter.calls.items() if w == whose})
        return ", ".join(f"{name} {n:,}" for name, n in names.most_common()) or "none"

    kernels = any(w == "yours" and name in numba_backend.PIECES for w, name in meter.calls)
    nodes = sum(graph.values())
    my_nodes = collections.Counter({name: n for (w, name), n in graph.items() if w == "yours"})
    lines = [f"one training step: {calls:,} calls computed its numbers; {mine:,} of them ran your code "
             f"({100 * mine / max(calls, 1):.1f}%)",
             f"  yours: {listing('yours')}",
             f"  the course's: {listing('course')}",
             f"time: {1000 * seconds:.0f} ms in all; {100 * my_seconds / seconds:.0f}% inside your code's computations, "
             f"{100 * their_seconds / seconds:.0f}% inside the course's kernels, "
             f"{100 * (seconds - my_seconds - their_seconds) / seconds:.0f}% in the Python around them",
             f"the forward's graph: {nodes:,} nodes, {sum(my_nodes.values()):,} of them your Functions "
             f"({', '.join(sorted(my_nodes)) or 'none'}); the rest are the library's views and Add, Sub, Div"
             + (", on your kernels" if kernels else "")]
    return lines


def time_steps(lib, config, tokens, dtype=np.float64, steps=5, warmup=1, seed=1337):
    """Median ms per training step of chapter 04's PyTorch GPT, the course's GPT on the numpy and on the
    course's Numba backend, and yours on lib, from the same weights on the same batches, steps interleaved
    (a busy moment of the machine then hits all four alike)."""
    import torch

    from course_lib.gpt import configure_optimizer as torch_optimizer
    from course_lib.gpt import make_get_batch
    from course_lib.gpt import train_step as torch_step
    from course_lib.gpt.model import GPT as TorchGPT
    from course_lib.gpt.trainer import TrainConfig

    cfg = TrainConfig()
    torch.manual_seed(seed)
    reference = TorchGPT(config).to(torch.float64 if dtype == np.float64 else torch.float32)
    runs = {"PyTorch": (reference, torch_optimizer(reference, cfg), torch_step, contextlib.nullcontext)}
    for name, backend in (("course, numpy backend", "numpy"), ("course, Numba backend", "numba")):
        model = capstone_model.GPT.from_torch(reference)
        runs[name] = (model, course_optimizer(model, cfg), train_step, functools.partial(use_backend, backend))
    model = lib.GPT.from_torch(reference)
    runs["yours"] = (model, lib.configure_optimizer(model, cfg), train_step, lib.running)
    get_batch = make_get_batch(tokens, config.block_size, cfg.batch_size, seed=seed)
    ms = {name: [] for name in runs}
    for i in range(warmup + steps):
        x, y = get_batch("train")
        for name, (model, optimizer, step, within) in runs.items():
            with within():
                start = time.perf_counter()
                step(model, optimizer, x, y, cfg.grad_clip)
                if i >= warmup:
                    ms[name].append(1000 * (time.perf_counter() - start))
    return {name: float(np.median(t)) for name, t in ms.items()}
