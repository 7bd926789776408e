"""Storage, shape and strides: how an n-d array lives in flat memory.

A `TensorData` is a flat 1-D numpy array (the storage) plus three numbers per view:
`shape`, `strides` (in elements, not bytes) and `offset`. Element `index` of the view
sits at `storage[offset + sum(index[i] * strides[i])]`. Views (permute, expand,
slicing, reshape of contiguous data) make a new TensorData over the same storage.

The index helpers below are plain loops over integer sequences, the ones lesson 02 writes.
"""

from __future__ import annotations

import math

import numpy as np

DTYPES = (np.float32, np.float64)


class ShapeError(ValueError):
    """A shape does not fit the operation. The message names the op and the shapes."""


# ---------------------------------------------------------------- index math

def index_to_position(index, strides, offset=0):
    """Multi-index -> position in storage: offset + sum(index[i] * strides[i])."""
    pos = offset
    for i in range(len(index)):
        pos += index[i] * strides[i]
    return pos


def to_index(ordinal, shape, out_index):
    """Ordinal (0 .. size-1, row-major) -> multi-index, written into `out_index`."""
    for i in range(len(shape) - 1, -1, -1):
        out_index[i] = ordinal % shape[i]
        ordinal = ordinal // shape[i]


def contiguous_strides(shape) -> tuple:
    """Row-major strides of a fresh array: the last dimension moves fastest."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


# ---------------------------------------------------------------- the data

_STRIDES: dict = {}  # shape -> its contiguous strides (shapes repeat from step to step)

class TensorData:
    """A strided view: `storage` (1-D float32/float64 numpy array), shape, strides, offset."""

    __slots__ = ("storage", "shape", "strides", "offset", "_contiguous")

    def __init__(self, storage: np.ndarray, shape, strides=None, offset: int = 0):
        assert storage.ndim == 1, "storage must be flat"
        self.storage = storage
        self.shape = tuple(int(n) for n in shape)
        if strides is None:
            self.strides, self._contiguous = contiguous_strides(self.shape), True
        else:
            self.strides, self._contiguous = tuple(int(s) for s in strides), None
        self.offset = int(offset)
        assert len(self.strides) == len(self.shape)

    # -- construction
    @classmethod
    def contiguous(cls, storage: np.ndarray, shape: tuple) -> "TensorData":
        """Fast path for fresh row-major results (shape: a tuple of ints, as numpy gives)."""
        td = cls.__new__(cls)
        td.storage, td.shape, td.offset, td._contiguous = storage, shape, 0, True
        strides = _STRIDES.get(shape)
        if strides is None:
            strides = _STRIDES[shape] = contiguous_strides(shape)
        td.strides = strides
        return td

    @staticmethod
    def from_numpy(array, dtype=None) -> "TensorData":
        """Copy any array-like into a fresh contiguous TensorData."""
        arr = np.array(array, dtype=dtype or np.float32, copy=True, order="C")
        if arr.dtype not in DTYPES:
            arr = arr.astype(np.float32)
        return TensorData(arr.reshape(-1), arr.shape)

    @staticmethod
    def zeros(shape, dtype=np.float32) -> "TensorData":
        shape = tuple(int(n) for n in shape)
        return TensorData(np.zeros(math.prod(shape), dtype=dtype), shape)

    # -- facts
    @property
    def dtype(self):
        return self.storage.dtype

    @property
    def dims(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        """True when the view walks storage in row-major order with no gaps."""
        if self._contiguous is None:
            self._contiguous = self._check_contiguous()
        return self._contiguous

    def _check_contiguous(self) -> bool:
        expected = contiguous_strides(self.shape)
        return all(s == e for s, e, n in zip(self.strides, expected, self.shape) if n != 1)

    def position(self, index) -> int:
        return index_to_position(index, self.strides, self.offset)

    def to_numpy(self) -> np.ndarray:
        """A numpy view of the same memory (no copy): numpy understands strides too.
        Treat it as read-only unless the data is a fresh output. Storage in a GPU's memory (chapter 07's
        CUDA backend) is copied to the host first: the view is then of that copy."""
        storage = self.storage
        if not isinstance(storage, np.ndarray):
            storage = storage.copy_to_host()
        if self.offset == 0 and storage.size == self.size and self.is_contiguous():
            return storage.reshape(self.shape)
        if self.size == 0:
            return np.zeros(self.shape, storage.dtype)
        item = storage.itemsize
        return np.ndarray(self.shape, storage.dtype, buffer=storage, offset=self.offset * item,
                          strides=tuple(s * item for s in self.strides))

    writable_numpy = to_numpy

    # -- views (no copy)
    def permute(self, *order) -> "TensorData":
        if sorted(order) != list(range(self.dims)):
            raise ShapeError(f"permute: {order} is not a permutation of the {self.dims} dims of {self.shape}")
        return TensorData(self.storage, [self.shape[i] for i in order],
                          [self.strides[i] for i in order], self.offset)

    def expand(self, shape) -> "TensorData":
        """Broadcast to `shape` by giving the new and size-1 dims stride 0."""
        shape = tuple(shape)
        extra = len(shape) - self.dims
        if extra < 0 or any(n not in (1, m) for n, m in zip(self.shape, shape[extra:])):
            raise ShapeError(f"expand: cannot expand {self.shape} to {shape} (each dim must match or be 1)")
        strides = [0] * extra + [0 if n == 1 and m != 1 else s
                                 for n, m, s in zip(self.shape, shape[extra:], self.strides)]
        return TensorData(self.storage, shape, strides, self.offset)

    def view(self, shape) -> "TensorData":
        """Reshape without copying; only for contiguous data."""
        if not self.is_contiguous():
            raise ShapeError(f"view needs contiguous data, got shape {self.shape} with strides {self.strides}")
        return TensorData(self.storage, shape, None, self.offset)

    def __repr__(self) -> str:
        return f"TensorData(shape={self.shape}, strides={self.strides}, offset={self.offset})"


def slice_view(td: TensorData, key) -> TensorData:
    """Basic indexing (ints, slices, None, ...) as a view: new shape, strides and offset."""
    if not isinstance(key, tuple):
        key = (key,)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > td.dims:
        raise IndexError(f"getitem: too many indices ({n_real}) for a tensor of shape {td.shape}")
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (td.dims - n_real) + key[i + 1:]
        n_real = td.dims
    key = key + (slice(None),) * (td.dims - n_real)
    shape, strides, offset, dim = [], [], td.offset, 0
    for k in key:
        if k is None:
            shape.append(1)
            strides.append(0)
            continue
        n, s = td.shape[dim], td.strides[dim]
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            if step <= 0:
                raise IndexError("getitem: only positive slice steps are supported")
            shape.append(len(range(start, stop, step)))
            strides.append(s * step)
            offset += start * s
        elif isinstance(k, (int, np.integer)):
            if not -n <= k < n:
                raise IndexError(f"getitem: index {k} is out of range for dim {dim} of size {n} (shape {td.shape})")
            offset += (k % n) * s
        else:
            raise IndexError(f"getitem: unsupported index {k!r} (use ints, slices, None, ...)")
        dim += 1
    return TensorData(td.storage, shape, strides, offset)
