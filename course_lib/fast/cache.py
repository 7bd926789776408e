"""Numba's saved machine code for this package, dropped when code it inlined from other files changed.

Every kernel here is compiled with `cache=True`: its machine code is saved next to this package (in
`__pycache__`), and the next Python process loads it instead of compiling again. Numba checks only the
file that defines a kernel: editing it recompiles that file's kernels. But the kernels inline code of
other files (the scalar ops of tensor/scalar_ops.py, the index helper of tensor/tensor_data.py, and each
other's: flat.py's kernels inline ops.py's switches), and after a `git pull` that changed only
scalar_ops.py, Numba would load machine code that still computes the old ops.

`drop_stale_kernels` keeps a fingerprint of all those files beside the saved code, and when it
changes deletes the saved code, which then compiles afresh. Importing the package deletes nothing: the
course's entry points call it before any kernel runs (every `course` command, in course/commands.py, which starts
the notebooks' kernels, and the test suite, in tests/conftest.py).
"""

import hashlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / "__pycache__"
#: the files whose code the kernels of this package carry inside them
INLINED = (HERE.parent / "tensor" / "scalar_ops.py", HERE.parent / "tensor" / "tensor_data.py",
           *sorted(HERE.glob("*.py")))


def fingerprint(sources=INLINED):
    return hashlib.sha256(b"".join(Path(p).read_bytes() for p in sources)).hexdigest()


def drop_stale_kernels(cache=CACHE, sources=INLINED):
    """Delete the saved machine code in `cache` unless it was compiled from `sources` as they are now.

    Returns whether anything was dropped. A read-only install is left alone (Numba then caches
    elsewhere, or compiles in each process)."""
    now = fingerprint(sources)
    stamp = Path(cache) / "inlined.sha256"
    try:
        if stamp.exists() and stamp.read_text() == now:
            return False
        for f in list(Path(cache).glob("*.nbi")) + list(Path(cache).glob("*.nbc")):
            f.unlink()
        Path(cache).mkdir(exist_ok=True)
        stamp.write_text(now)
        return True
    except OSError:
        return False
