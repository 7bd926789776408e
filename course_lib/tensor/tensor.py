"""The Tensor: strided data plus the autograd record, with a torch-like API.

Every method is a thin wrapper: it picks the Function from the op registry, imported
as `F` (registry.py: functions.py's classes, unless a `use_ops` block put others in),
and calls `.apply`, which computes the value on the current backend and records the
op so that `.backward()` can run it in reverse.
"""

from __future__ import annotations

import math

import numpy as np

from course_lib.tensor import autodiff
from course_lib.tensor.registry import OPS as F  # functions.py's ops, unless a use_ops block put others in
from course_lib.tensor.tensor_data import ShapeError, TensorData

float32, float64 = np.float32, np.float64
_rng = [np.random.default_rng(0)]
_constants: dict = {}


def manual_seed(seed: int) -> None:
    """Seed the generator behind randn, rand, parameter init, dropout and DataLoader."""
    _rng[0] = np.random.default_rng(seed)


def generator() -> np.random.Generator:
    return _rng[0]


class Tensor:
    """An n-d array of float32 or float64 that can record the ops applied to it."""

    __array_priority__ = 100  # numpy scalar * Tensor -> our __rmul__

    def __init__(self, data, requires_grad: bool = False, dtype=None):
        if isinstance(data, Tensor):
            data = data.data.to_numpy()
        if isinstance(data, TensorData):
            td = data
        else:
            if dtype is None:  # like torch: float64 numpy arrays stay float64, the rest float32
                keep = getattr(data, "dtype", None) == np.float64
                dtype = np.float64 if keep else np.float32
            td = TensorData.from_numpy(data, dtype)
        self.data = td
        self.requires_grad = requires_grad
        self.grad = None
        self._ctx = None
        self._fn = None
        self._parents = ()
        self._version = 0
        self._retain = False
        self.name = ""

    @classmethod
    def _wrap(cls, td: TensorData, requires_grad: bool = False) -> "Tensor":
        t = cls.__new__(cls)
        t.data, t.requires_grad, t.grad = td, requires_grad, None
        t._ctx, t._fn, t._parents, t._version, t._retain, t.name = None, None, (), 0, False, ""
        return t

    def _new(self, td: TensorData) -> "Tensor":
        """A constant tensor (no history) from raw data."""
        return Tensor._wrap(td)

    def _lift(self, other) -> "Tensor":
        """Python numbers become 0-d tensors of this tensor's dtype."""
        if isinstance(other, Tensor):
            return other
        key = (float(other), self.dtype)
        td = _constants.get(key)
        if td is None:  # constants are never written to, so one copy serves every use
            if len(_constants) > 4096:
                _constants.clear()
            td = _constants[key] = TensorData(np.array([other], dtype=self.dtype), ())
        return Tensor._wrap(td)

    # ---------------------------------------------------------------- facts
    @property
    def shape(self) -> tuple:
        return self.data.shape

    @property
    def ndim(self) -> int:
        return len(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        return self.data.size

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def is_leaf(self) -> bool:
        return self._fn is None

    def numpy(self) -> np.ndarray:
        """A numpy copy of the values (never shares memory with the tensor)."""
        if autodiff._modes:
            autodiff._modes[-1].read(self)
        return np.array(self.data.to_numpy())

    def tolist(self):
        return self.numpy().tolist()

    def item(self) -> float:
        if self.numel() != 1:
            raise ValueError(f"item: only a tensor with one element has an item, this one has shape {self.shape}")
        if autodiff._modes:
            autodiff._modes[-1].read(self)
        return float(self.data.to_numpy().reshape(-1)[0])

    def __repr__(self) -> str:
        body = np.array2string(self.data.to_numpy(), precision=4, separator=", ", prefix="tensor(")
        extra = ", requires_grad=True" if self.requires_grad else ""
        extra += ", dtype=float64" if self.dtype == np.float64 else ""
        return f"tensor({body}{extra})"

    def __float__(self):
        return self.item()

    def __bool__(self):
        if self.numel() != 1:
            raise ValueError(f"the truth value of a tensor of shape {self.shape} is ambiguous")
        return bool(self.item())

    __hash__ = object.__hash__

    # ---------------------------------------------------------------- autograd
    def backward(self, gradient: "Tensor | None" = None) -> None:
        """Fill `.grad` of every leaf that requires grad with d(self)/d(leaf)."""
        if not self.requires_grad:
            raise RuntimeError("backward: this tensor does not require grad and has no graph "
                               "(did you build it under no_grad, or forget requires_grad=True?)")
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(
                    f"backward: grad can be created implicitly only for a scalar output, but this "
                    f"tensor has shape {self.shape}; reduce it (e.g. .sum()) or pass "
                    f".backward(gradient) with a tensor of shape {self.shape}")
            gradient = Tensor._wrap(TensorData(np.ones(1, dtype=self.dtype), self.shape))
        gradient = self._lift(gradient)
        if gradient.shape != self.shape:
            raise RuntimeError(f"backward: gradient has shape {gradient.shape}, the tensor has shape {self.shape}")
        autodiff.backward(self, gradient, F.topological_order)

    def _accumulate(self, g: "Tensor") -> None:
        if not g.data.is_contiguous() or g.data.storage.size != g.numel():
            g = g.contiguous()
        self.grad = g if self.grad is None else self.grad + g

    def retain_grad(self) -> "Tensor":
        """Keep `.grad` on this non-leaf tensor too (leaves always keep theirs)."""
        self._retain = True
        return self

    def detach(self) -> "Tensor":
        """The same data, cut from the graph."""
        return Tensor._wrap(self.data)

    def requires_grad_(self, flag: bool = True) -> "Tensor":
        self.requires_grad = flag
        return self

    def zero_grad(self) -> None:
        self.grad = None

    # ---------------------------------------------------------------- in-place (bump the version)
    def _assign(self, td: TensorData) -> "Tensor":
        if self.requires_grad and not self.is_leaf and autodiff.is_grad_enabled():
            raise RuntimeError("in-place change of a tensor that is part of a graph; use out-of-place ops")
        if td.shape != self.shape:
            raise ShapeError(f"in-place update: shape {td.shape} does not match tensor shape {self.shape}")
        self.data = td
        self._version += 1
        return self

    def copy_(self, other) -> "Tensor":
        other = self._lift(other)
        from course_lib.tensor.backend import current_backend
        return self._assign(current_backend().map("id", other.data.expand(self.shape)
                                                  if other.shape != self.shape else other.data))

    def add_(self, other, alpha: float = 1.0) -> "Tensor":
        with autodiff.no_grad():
            return self._assign((self + self._lift(other) * alpha).data)

    def mul_(self, other) -> "Tensor":
        with autodiff.no_grad():
            return self._assign((self * other).data)

    def zero_(self) -> "Tensor":
        return self._assign(TensorData.zeros(self.shape, self.dtype))

    # ---------------------------------------------------------------- arithmetic
    def __add__(self, other): return F.Add.apply(self, self._lift(other))
    def __radd__(self, other): return F.Add.apply(self._lift(other), self)
    def __sub__(self, other): return F.Sub.apply(self, self._lift(other))
    def __rsub__(self, other): return F.Sub.apply(self._lift(other), self)
    def __mul__(self, other): return F.Mul.apply(self, self._lift(other))
    def __rmul__(self, other): return F.Mul.apply(self._lift(other), self)
    def __truediv__(self, other): return F.Div.apply(self, self._lift(other))
    def __rtruediv__(self, other): return F.Div.apply(self._lift(other), self)
    def __pow__(self, other): return F.Pow.apply(self, self._lift(other))
    def __rpow__(self, other): return F.Pow.apply(self._lift(other), self)
    def __neg__(self): return F.Neg.apply(self)
    def __matmul__(self, other): return matmul(self, other)

    def exp(self): return F.Exp.apply(self)
    def log(self): return F.Log.apply(self)
    def sqrt(self): return F.Sqrt.apply(self)
    def relu(self): return F.ReLU.apply(self)
    def sigmoid(self): return F.Sigmoid.apply(self)
    def tanh(self): return F.Tanh.apply(self)
    def gelu(self, approximate: str = "none"):
        """The exact GELU a * Phi(a), or with approximate="tanh" GPT-2's tanh form (as torch's F.gelu)."""
        if approximate not in ("none", "tanh"):
            raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        return F.GELUTanh.apply(self) if approximate == "tanh" else F.GELU.apply(self)

    def maximum(self, other): return F.Maximum.apply(self, self._lift(other))
    def where(self, cond, other): return where(cond, self, other)

    def masked_fill(self, mask, value: float):
        """A copy with `value` wherever `mask` (bool array or 1.0/0.0 tensor, broadcast to self) is true."""
        if not isinstance(mask, Tensor):
            mask = Tensor(np.asarray(mask, dtype=self.dtype), dtype=self.dtype)
        return F.MaskedFill.apply(self, mask, value=value)

    def abs(self): return where(self >= 0, self, -self)

    # comparisons: float 1.0/0.0 tensors with no gradient
    def _compare(self, op, other):
        return Tensor._wrap(F.zip_(op, self, self._lift(other)))

    def __eq__(self, other): return self._compare("eq", other)
    def __ne__(self, other): return self._compare("ne", other)
    def __lt__(self, other): return self._compare("lt", other)
    def __le__(self, other): return self._compare("le", other)
    def __gt__(self, other): return self._compare("gt", other)
    def __ge__(self, other): return self._compare("ge", other)

    # ---------------------------------------------------------------- reductions
    def _dims(self, dim) -> tuple:
        if dim is None:
            return tuple(range(self.ndim))
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        for d in dims:
            if not -max(self.ndim, 1) <= d < max(self.ndim, 1):
                raise IndexError(f"dim {d} is out of range for a tensor of shape {self.shape}")
        return tuple(sorted(d % self.ndim for d in dims)) if self.ndim else ()

    def _reduce(self, fn, dim, keepdim):
        return F.reduce_dims(fn, self, self._dims(dim), keepdim)

    def sum(self, dim=None, keepdim: bool = False):
        return self._reduce(F.Sum, dim, keepdim)

    def mean(self, dim=None, keepdim: bool = False):
        dims = self._dims(dim)
        count = math.prod([self.shape[d] for d in dims])
        return self.sum(dim, keepdim) / float(count)

    def max(self, dim=None, keepdim: bool = False):
        """The largest values over `dim` (values only, like torch.amax)."""
        return self._reduce(F.Max, dim, keepdim)

    def var(self, dim=None, keepdim: bool = False, unbiased: bool = False):
        mu = self.mean(dim, keepdim=True)
        dims = self._dims(dim)
        count = math.prod([self.shape[d] for d in dims])
        return ((self - mu) ** 2.0).sum(dim, keepdim) / float(count - 1 if unbiased else count)

    def softmax(self, dim: int = -1): return F.Softmax.apply(self, dim=_dim(dim, self.ndim, "softmax", self.shape))
    def log_softmax(self, dim: int = -1):
        return F.LogSoftmax.apply(self, dim=_dim(dim, self.ndim, "log_softmax", self.shape))

    # ---------------------------------------------------------------- shapes
    def reshape(self, *shape):
        shape = _shape_arg(shape)
        if -1 in shape:
            known = math.prod([n for n in shape if n != -1])
            shape = tuple(self.numel() // known if n == -1 and known else n for n in shape)
        if math.prod(shape) != self.numel():
            raise ShapeError(f"reshape: cannot reshape {self.shape} ({self.numel()} elements) to {shape}")
        if shape == self.shape:
            return self
        return F.Reshape.apply(self, shape=shape)

    def view(self, *shape):
        """reshape, but never a copy: like torch, it refuses data that is not contiguous."""
        if not self.data.is_contiguous():
            raise ShapeError(f"view: this tensor of shape {self.shape} has strides {self.data.strides}, not "
                             f"contiguous ones (after a permute, transpose or slice?), so it cannot be viewed as "
                             f"a new shape without a copy; use .reshape(...), or .contiguous().view(...)")
        return self.reshape(*shape)

    def flatten(self, start_dim: int = 0):
        start_dim = _dim(start_dim, max(self.ndim, 1), "flatten", self.shape)
        return self.reshape(self.shape[:start_dim] + (-1,))

    def contiguous(self):
        if self.data.is_contiguous() and self.data.storage.size == self.numel():
            return self
        from course_lib.tensor.backend import current_backend
        return F.Reshape.apply(self, shape=self.shape) if self.requires_grad else \
            Tensor._wrap(current_backend().map("id", self.data))

    def permute(self, *order):
        order = tuple(_dim(d, self.ndim, "permute", self.shape) for d in _shape_arg(order))
        if sorted(order) != list(range(self.ndim)):
            raise ShapeError(f"permute: {_shape_arg(order)} is not an ordering of the {self.ndim} dims of {self.shape}")
        return F.Permute.apply(self, order=order)

    def transpose(self, d0: int = -2, d1: int = -1):
        d0, d1 = (_dim(d, self.ndim, "transpose", self.shape) for d in (d0, d1))
        order = list(range(self.ndim))
        order[d0], order[d1] = order[d1], order[d0]
        return self.permute(*order)

    @property
    def T(self):
        return self.permute(*reversed(range(self.ndim)))

    def expand(self, *shape):
        shape = _shape_arg(shape)
        extra = len(shape) - self.ndim
        shape = tuple(self.shape[i - extra] if n == -1 else n for i, n in enumerate(shape))
        if shape == self.shape:
            return self
        return F.Expand.apply(self, shape=shape)

    def unsqueeze(self, dim: int):
        dim = _dim(dim, self.ndim + 1, "unsqueeze", self.shape)
        return self.reshape(self.shape[:dim] + (1,) + self.shape[dim:])

    def squeeze(self, dim: int):
        dim = _dim(dim, self.ndim, "squeeze", self.shape)
        return self.reshape(self.shape[:dim] + self.shape[dim + 1:]) if self.shape[dim] == 1 else self

    def split(self, size: int, dim: int = -1) -> tuple:
        """Views of `size` consecutive entries along `dim` (the last may be shorter), as torch.split."""
        dim = _dim(dim, self.ndim, "split", self.shape)
        lead = (slice(None),) * dim
        return tuple(self[lead + (slice(i, i + size),)] for i in range(0, self.shape[dim], size))

    def __getitem__(self, key):
        if isinstance(key, Tensor) or isinstance(key, (list, np.ndarray)):
            raise IndexError("getitem: indexing with a tensor/list is not supported; use ints, slices, None, ...")
        return F.GetItem.apply(self, key=key)


def _dim(d: int, ndim: int, op: str, shape) -> int:
    """The dim `d` as a non-negative index; like Python lists, -1 is the last, and -ndim..ndim-1 are allowed."""
    if not -ndim <= d < ndim:
        raise IndexError(f"{op}: dim {d} is out of range for a tensor of shape {tuple(shape)} "
                         f"(allowed: {-ndim} to {ndim - 1})")
    return d % ndim


def _shape_arg(shape) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(int(n) for n in shape)


# ---------------------------------------------------------------- free functions

def tensor(data, requires_grad: bool = False, dtype=None) -> Tensor:
    return Tensor(data, requires_grad=requires_grad, dtype=dtype)


def zeros(*shape, dtype=np.float32, requires_grad=False) -> Tensor:
    return Tensor._wrap(TensorData.zeros(_shape_arg(shape), dtype), requires_grad)


def ones(*shape, dtype=np.float32, requires_grad=False) -> Tensor:
    shape = _shape_arg(shape)
    return Tensor(np.ones(shape, dtype=dtype), requires_grad=requires_grad, dtype=dtype)


def randn(*shape, dtype=np.float32, requires_grad=False) -> Tensor:
    return Tensor(_rng[0].standard_normal(_shape_arg(shape)), requires_grad=requires_grad, dtype=dtype)


def rand(*shape, dtype=np.float32, requires_grad=False) -> Tensor:
    return Tensor(_rng[0].random(_shape_arg(shape)), requires_grad=requires_grad, dtype=dtype)


def arange(n, dtype=np.float32) -> Tensor:
    return Tensor(np.arange(n), dtype=dtype)


def zeros_like(t: Tensor) -> Tensor:
    return zeros(t.shape, dtype=t.dtype)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Batched a @ b; 1-d operands are treated as a row (a) or a column (b), as in torch."""
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul: both operands need at least 1 dim, got shapes {a.shape} and {b.shape}")
    if a.ndim == 1 and b.ndim >= 1:
        out = matmul(a.reshape(1, -1), b)
        return out.squeeze(-2)
    if b.ndim == 1:
        return matmul(a, b.reshape(-1, 1)).squeeze(-1)
    return F.MatMul.apply(a, b)


def where(cond, a, b) -> Tensor:
    """Elementwise cond ? a : b (cond: a tensor of 1.0/0.0, e.g. from a comparison)."""
    like = a if isinstance(a, Tensor) else b
    if not isinstance(cond, Tensor):
        cond = Tensor(np.asarray(cond, dtype=like.dtype))
    return F.Where.apply(cond, like._lift(a), like._lift(b))


def cat(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    return F.Cat.apply(*tensors, dim=dim % tensors[0].ndim)


def stack(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    shapes = {t.shape for t in tensors}
    if len(shapes) != 1:
        raise ShapeError(f"stack: all tensors need the same shape, got {[t.shape for t in tensors]}")
    dim = dim % (tensors[0].ndim + 1)
    return cat([t.unsqueeze(dim) for t in tensors], dim)


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    return x.softmax(dim)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    return x.log_softmax(dim)


def one_hot(target, classes: int, dtype=np.float32) -> Tensor:
    idx = np.asarray(target.numpy() if isinstance(target, Tensor) else target).astype(np.int64)
    out = np.zeros(idx.shape + (classes,), dtype=dtype)
    np.put_along_axis(out, idx[..., None], 1.0, axis=-1)
    return Tensor(out, dtype=dtype)


def cross_entropy(logits: Tensor, target) -> Tensor:
    """Mean of -log softmax(logits)[target] over the batch (target: class indices)."""
    if logits.ndim != 2:
        raise ShapeError(f"cross_entropy: logits must be (batch, classes), got {logits.shape}")
    target = np.asarray(target.numpy() if isinstance(target, Tensor) else target)
    if target.shape != logits.shape[:1]:
        raise ShapeError(f"cross_entropy: target shape {target.shape} does not match logits {logits.shape}")
    if target.size and not np.issubdtype(target.dtype, np.integer):
        raise TypeError(f"cross_entropy: target must hold class indices (ints), got dtype {target.dtype}")
    bad = np.flatnonzero((target < 0) | (target >= logits.shape[1]))
    if bad.size:
        raise IndexError(f"cross_entropy: target[{bad[0]}] = {target[bad[0]]} is not a class index; "
                         f"with {logits.shape[1]} classes they run from 0 to {logits.shape[1] - 1}")
    return F.CrossEntropy.apply(logits, one_hot(target, logits.shape[1], logits.dtype))
