"""The backend interface: the four loops every tensor op is built from.

Autograd, modules and optimizers never touch numbers directly. They call a backend,
which runs one of four strided loops. Swap the backend and the whole library runs
on other hardware: numpy here (chapter 02), Numba on the CPU (chapter 06), Numba
CUDA (chapter 07).

What a backend must implement
-----------------------------
A backend is an object with these four methods. Inputs and outputs are
`TensorData` (see tensor_data.py): a flat host numpy storage (float32 or float64)
plus shape, strides (in elements) and offset. Inputs may be any strided view
(permuted, expanded with stride 0, sliced with an offset): never assume contiguous.
Never write into an input. A device backend may copy storage to the device and back
inside each call. Shapes may be () (a 0-d scalar) in map and zip; sizes may be 0.
Storage dtype is float32 or float64; outputs keep the input dtype (zip: the wider).

    map(op, a, out=None) -> TensorData
        out[i] = f(a[i]) for the unary op named `op` (one of MAP_OPS).
        out=None: allocate a fresh contiguous output of a's shape and dtype.
        out given: write into that view (any strides, e.g. a slice of a bigger
        array) and return it; a is broadcast to out.shape. map("id", a, out)
        is how the library copies and scatters.

    zip(op, a, b, out=None) -> TensorData
        out[i] = f(a[i], b[i]) for the binary op named `op` (one of ZIP_OPS), with
        a and b broadcast to shape_broadcast(a.shape, b.shape). dtype: the wider of
        the two. Comparisons give 1.0 or 0.0 in that dtype. out as in map.

    reduce(op, a, dim) -> TensorData
        Reduce dimension `dim` (0 <= dim < a.dims) with the op named `op`
        (one of REDUCE_OPS). The output is contiguous, with a.shape except
        shape[dim] == 1 (keepdim). a.shape[dim] >= 1.

    matmul(a, b) -> TensorData
        Batched matrix product: a is (..., n, k), b is (..., k, m), both with at
        least 2 dims; the batch dims (...) broadcast. Output: contiguous
        (broadcast batch..., n, m).

Optional: adam(p, g, m, v, lr, betas, eps, t, decay, decoupled) -> TensorData
        One whole Adam step over flat contiguous vectors: update m and v in place and
        return the new p (decay: None, a number, or one per parameter; decoupled: AdamW).
        optim.Adam calls it when the current backend has it (chapter 06's does: one
        pass over the parameters instead of a dozen ops).

Shape checks (broadcast, matmul's k) happen in the tensor layer before a backend is
called, so a backend may assume valid shapes. Everything else (where, cat, getitem's
backward, softmax, ...) is composed from these four by the tensor layer; a backend
may also override `where` for speed.

This interface is frozen: later changes only add (new op names, optional methods).

The ops, by name (a compiled backend turns each name into a kernel):
"""

from __future__ import annotations

import contextlib
import importlib

from course_lib.tensor import scalar_ops
from course_lib.tensor.tensor_data import TensorData

#: unary ops for `map`: name -> the scalar function each one computes (scalar_ops.py)
MAP_OPS = {name: f.__doc__ for name, f in scalar_ops.MAP.items()}

#: binary ops for `zip`
ZIP_OPS = {name: f.__doc__ for name, f in scalar_ops.ZIP.items()}

#: reductions for `reduce`
REDUCE_OPS = {name: f"acc = {op}(acc, x) for each x along dim, from acc = {start}"
              for name, (op, start) in scalar_ops.REDUCE.items()}

__doc__ += "\n".join(
    [f"    map  {k:10s} {v}" for k, v in MAP_OPS.items()]
    + [f"    zip  {k:10s} {v}" for k, v in ZIP_OPS.items()]
    + [f"    reduce {k:8s} {v}" for k, v in REDUCE_OPS.items()])


class Backend:
    """Base class of a backend. Subclasses implement map, zip, reduce and matmul."""

    name = "abstract"

    def map(self, op: str, a: TensorData, out: TensorData | None = None) -> TensorData:
        raise NotImplementedError

    def zip(self, op: str, a: TensorData, b: TensorData, out: TensorData | None = None) -> TensorData:
        raise NotImplementedError

    def reduce(self, op: str, a: TensorData, dim: int) -> TensorData:
        raise NotImplementedError

    def matmul(self, a: TensorData, b: TensorData) -> TensorData:
        raise NotImplementedError

    def where(self, cond: TensorData, a: TensorData, b: TensorData) -> TensorData:
        """cond ? a : b elementwise, with broadcasting. Default: two zips (override for speed
        and for inf/nan in the branch not taken)."""
        picked_a = self.zip("mul", cond, a)
        not_cond = self.zip("eq", cond, _scalar(0.0, cond.dtype))
        return self.zip("add", picked_a, self.zip("mul", not_cond, b))

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


def _scalar(value, dtype) -> TensorData:
    return TensorData.from_numpy([value], dtype=dtype).view(())


# ---------------------------------------------------------------- selection

#: backend name -> a module path with a module-level `backend` (imported on first use),
#: or the backend object itself (see register_backend)
REGISTRY: dict = {}

_loaded: dict = {}
_current = ["numpy"]
_MISSING = object()


class BackendUnavailable(RuntimeError):
    """The named backend cannot be loaded here; the message says why."""


def register_backend(name: str, backend) -> None:
    """Make `backend` available as `name` for set_backend and use_backend; replaces an earlier one.

    backend: an object with the four methods above (a backend written in a notebook, say), or the
    dotted path of a module with a module-level `backend`, imported only when first used.
    """
    if isinstance(backend, str):
        _loaded.pop(name, None)
        REGISTRY[name] = backend
        return
    missing = [m for m in ("map", "zip", "reduce", "matmul") if not callable(getattr(backend, m, None))]
    if missing:
        raise TypeError(f"backend {name!r} lacks {', '.join(missing)}: a backend needs map, zip, reduce "
                        "and matmul (see the interface at the top of course_lib/tensor/backend.py)")
    REGISTRY[name] = backend
    _loaded[name] = backend


def unregister_backend(name: str) -> None:
    """Forget the backend registered as `name`. The backend in use cannot be forgotten: leave its
    `use_backend` block (or `set_backend` another) first."""
    if name not in REGISTRY:
        raise KeyError(f"no backend {name!r} is registered; known: {sorted(REGISTRY)}")
    if name == _current[0]:
        raise RuntimeError(f"backend {name!r} is the one in use; switch to another before unregistering it")
    del REGISTRY[name]
    _loaded.pop(name, None)


@contextlib.contextmanager
def registered_backend(name: str, backend):
    """`with registered_backend("mine", backend): ...` makes `backend` available as `name` for the block
    only (as register_backend does); afterwards the registry holds what it held before: the earlier
    backend of that name, or none. The compiler's tracing backend lives this way, for one capture."""
    saved = (REGISTRY.get(name, _MISSING), _loaded.get(name, _MISSING))
    register_backend(name, backend)
    try:
        yield get_backend(name)
    finally:
        for table, value in zip((REGISTRY, _loaded), saved):
            if value is _MISSING:
                table.pop(name, None)
            else:
                table[name] = value


# The course's own backends, imported lazily: chapter 06's Numba one and chapter 07's CUDA one
# need compilers and drivers that chapter 02 does not.
register_backend("numpy", "course_lib.tensor.numpy_backend")
register_backend("numba", "course_lib.fast.backend")
register_backend("cuda", "course_lib.cuda.backend")


def get_backend(name: str | None = None) -> Backend:
    """The backend object for `name` (default: the current one), imported lazily."""
    name = name or _current[0]
    if name in _loaded:
        return _loaded[name]
    if name not in REGISTRY:
        raise BackendUnavailable(f"unknown backend {name!r}; known: {sorted(REGISTRY)}")
    module_name = REGISTRY[name]
    if not isinstance(module_name, str):
        return module_name
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise BackendUnavailable(f"backend {name!r}: module {module_name} does not exist yet") from None
        raise BackendUnavailable(f"backend {name!r}: importing {module_name} failed: {e}") from e
    except Exception as e:  # noqa: BLE001 - e.g. no CUDA driver
        raise BackendUnavailable(f"backend {name!r}: importing {module_name} failed: {e}") from e
    backend = getattr(module, "backend", None)
    if backend is None:
        raise BackendUnavailable(f"backend {name!r}: {module_name} has no module-level `backend`")
    _loaded[name] = backend
    return backend


def backend_status(name: str) -> tuple[bool, str]:
    """(True, "") if the backend loads, else (False, the reason)."""
    try:
        get_backend(name)
        return True, ""
    except BackendUnavailable as e:
        return False, str(e)


def available_backends() -> list[str]:
    """Names of the backends that load on this machine."""
    return [name for name in REGISTRY if backend_status(name)[0]]


def current_backend() -> Backend:
    return get_backend(_current[0])


def current_backend_name() -> str:
    return _current[0]


def set_backend(name: str) -> Backend:
    """Make `name` the backend every following op runs on. Returns the backend."""
    backend = get_backend(name)
    _current[0] = name
    return backend


@contextlib.contextmanager
def use_backend(name: str):
    """`with use_backend("numba"): ...` runs the block on that backend, then restores."""
    previous = _current[0]
    backend = set_backend(name)
    try:
        yield backend
    finally:
        _current[0] = previous
