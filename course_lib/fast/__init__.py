"""Chapter 06: fast CPU kernels with Numba, and a Numba backend for the chapter 02 tensor engine.

One idea per file:
    indexing.py  where element i of a strided view lives in flat storage (compiled, inlined)
    switch.py    one compiled function that runs op number `code` of tensor/scalar_ops.py's table
    ops.py       the scalar ops by code, and parallel strided map, zip, reduce and where kernels
    flat.py      per-op kernels for contiguous operands (full, row, column or one number), vectorized
    matmul.py    a parallel, tiled, batched matmul (how a fast matmul is built)
    blas.py      the backend's matmul: numpy's BLAS, so that one BLAS thread pool serves the process
    adam.py      Adam's whole update in one pass over the parameters (a fused optimizer kernel)
    pool.py      how many threads a call runs on: one for small work, the whole pool for big work
    backend.py   the four kernels behind chapter 02's backend interface: `set_backend("numba")`

Every kernel is compiled with `cache=True`: the machine code is saved next to this package
(in `__pycache__`), so the next Python process loads it instead of compiling again. Editing a
file recompiles that file's kernels, but only that file's, while the kernels here inline code of
other files: the scalar ops of tensor/scalar_ops.py, the index helper of tensor/tensor_data.py,
and each other's (flat.py's kernels inline ops.py's switches). So `_drop_stale_kernels` below keeps
a fingerprint of all those files, and when it changes (after a `git pull`, say) it deletes this
package's cached machine code, which then compiles afresh.
"""

import hashlib
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_INLINED = [_HERE.parent / "tensor" / "scalar_ops.py", _HERE.parent / "tensor" / "tensor_data.py", *sorted(_HERE.glob("*.py"))]


def _drop_stale_kernels(cache=_HERE / "__pycache__"):
    fingerprint = hashlib.sha256(b"".join(p.read_bytes() for p in _INLINED)).hexdigest()
    stamp = cache / "inlined.sha256"
    try:
        if stamp.exists() and stamp.read_text() == fingerprint:
            return
        for f in list(cache.glob("*.nbi")) + list(cache.glob("*.nbc")):
            f.unlink()
        cache.mkdir(exist_ok=True)
        stamp.write_text(fingerprint)
    except OSError:  # a read-only install: Numba then caches elsewhere, or compiles each time
        pass


_drop_stale_kernels()
