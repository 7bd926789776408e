"""Wrong implementations written as edits of the reference, so that the mistake is the diff.

    pool_no_halo = edited(P.k_pool3, "pool_no_halo", ("buf[t] = a[j] if j >= 0 else 0.0", "buf[t] = 0.0"))

takes the reference's source (decorators included), makes each replacement, names the function
`pool_no_halo` and runs the result with the reference's module globals (plus `env`, which may swap a
name the function calls or a constant such as TPB). Each `old` must occur in the source exactly once
(or `count` times, for a triple `(old, new, count)`), so a test fails loudly when the reference changes
under it instead of testing a mistake that is no longer there.

The edited source is written to a file named by its content, under tests/__pycache__/edited/, so that
`inspect.getsource` works on it (the CUDA launcher reads a kernel's source) and Numba's `cache=True`
keeps the compiled mistake between runs, as it does for the kernels written out in a test file.
"""

import hashlib
import inspect
import os
import sys
import tempfile
from pathlib import Path

FOLDER = Path(__file__).parent / "__pycache__" / "edited"


def source_of(fn):
    """The source of a function, a Numba dispatcher or a CUDA kernel, decorators included."""
    return inspect.getsource(getattr(fn, "py_func", fn))


def edit(source, changes):
    """`source` with each (old, new) or (old, new, count) change made; each must match as many times as it says."""
    for change in changes:
        old, new, count = change if len(change) == 3 else (*change, 1)
        found = source.count(old)
        assert found == count, (f"the edit {old!r} -> {new!r} expects {count} match(es) in the reference, found "
                                f"{found}: the reference changed, so this wrong implementation needs rewriting:\n{source}")
        source = source.replace(old, new)
    return source


def edited(reference, name, *changes, env=None):
    """The reference with `changes` made, compiled as the reference is, under the name `name`."""
    fn = getattr(reference, "py_func", reference)
    source = edit(source_of(reference), changes)
    head = f"def {fn.__name__}("
    assert head in source, f"{head!r} is not in the source of {fn.__name__}"
    source = source.replace(head, f"def {name}(", 1)
    # the reference's whole file is in the digest: a Numba function cached from this file must be
    # compiled again when a function it calls there changes
    origin = Path(inspect.getsourcefile(fn)).read_bytes()
    swapped = "".join(f"{k}={_fingerprint(v)};" for k, v in sorted((env or {}).items()))
    digest = hashlib.sha1(b"\0".join([origin, swapped.encode(), source.encode()])).hexdigest()[:12]
    text = f"# {name}: an edit of {fn.__module__}.{fn.__qualname__}\n{source}"
    path = _write(f"{sys._getframe(1).f_globals['__name__']}.{name}", digest, text)
    namespace = dict(fn.__globals__, **(env or {}))
    exec(compile(text, str(path), "exec"), namespace)
    return namespace[name]


def _fingerprint(value):
    """What a value swapped in through `env` contributes to the file's name: a function's source, else its repr."""
    try:
        return source_of(value)
    except TypeError:
        return repr(value)


def _write(stem, digest, text):
    """Write stem_digest.py once (an existing one is kept, so its time stamp and Numba's cache stay valid)
    and delete the stem's files of other digests, written for an older reference or edit."""
    try:
        FOLDER.mkdir(parents=True, exist_ok=True)
        folder = FOLDER
    except OSError:                     # a read-only checkout: a folder of the system's temporary files
        folder = Path(tempfile.gettempdir()) / "course-edited"
        folder.mkdir(exist_ok=True)
    path = folder / f"{stem}_{digest}.py"
    if not path.exists():
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as f:
            f.write(text)
        os.replace(f.name, path)        # atomic: a reader never sees half a file
        for old in folder.glob(f"{stem}_*.py"):
            if old != path and old.stem.rsplit("_", 1)[0] == stem:
                old.unlink(missing_ok=True)
    return path
