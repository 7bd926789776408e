"""Numba's saved machine code for the whole course, dropped when code it inlined from another file changed.

A kernel compiled with `cache=True` keeps its machine code on disk (in `__pycache__` next to the file
that defines it), and the next Python process loads it instead of compiling again. Numba checks only
the file that defines the kernel: editing it recompiles that file's kernels. But a kernel carries
inside it the code of every compiled function it calls, from other files: fast/'s kernels inline the
scalar ops of tensor/scalar_ops.py and each other's switches, fused/attention_cpu.py inlines
simd/tiles.py's products and simd/fastexp.py's exponential, the compiler's generated kernels inline
compiler/scalar.py. After a `git pull` that changed only tiles.py, Numba would load machine code that
still computes the old products.

`drop_stale_kernels` guards every such file, found by a search rather than kept in a list: the files of
course_lib that compile with `cache=True`, and the compiler's generated kernels. It follows their
imports inside course_lib (a kernel can inline only code its file imports, directly or not) and, for
each file whose functions they may compile, keeps a fingerprint of the files it imports beside the saved
code (`inlined.json`). When that fingerprint changes, it deletes the file's saved code, which then
compiles afresh. Importing the package deletes nothing: the course's entry points call it before any
kernel runs (every `course` command, in course/commands.py, which starts the notebooks' kernels, and the test
suite, in tests/conftest.py).
"""

import ast
import hashlib
import json
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]      # the folder that holds course_lib
CACHES = re.compile(r"\bcache\s*=\s*True")


def compiler_folder():
    """Where the compiler writes its generated kernels (the rule of compiler/kernels.cache_dir, which
    imports Numba: reading it here would make every `course` command load Numba)."""
    return Path(os.environ.get("COURSE_COMPILER_CACHE") or Path.home() / ".cache" / "course_lib" / "compiler")


def kernel_files(root=ROOT, package="course_lib", generated=None):
    """The files that compile kernels with `cache=True`: a search of the package, and the generated kernels."""
    found = [p for p in sorted((root / package).rglob("*.py")) if CACHES.search(p.read_text(encoding="utf-8"))]
    folder = compiler_folder() if generated is None else generated
    return found + (sorted(Path(folder).glob("k_*.py")) if folder and Path(folder).is_dir() else [])


def _module_file(root, name):
    path = root.joinpath(*name.split("."))
    return next((p for p in (path.with_suffix(".py"), path / "__init__.py") if p.is_file()), None)


def imports(path, root=ROOT, package="course_lib"):
    """The files of `package` (under `root`) that the file at `path` imports, anywhere in it."""
    path = Path(path)
    try:
        here = path.relative_to(root).with_suffix("").parts[:-1]   # the package a relative import starts from
    except ValueError:                                             # a generated kernel, outside the package
        here = ()
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ((base,) if base else ()))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    found = {_module_file(root, n) for n in names if n == package or n.startswith(package + ".")}
    return found - {None}


def imported_closure(path, root=ROOT, package="course_lib", known=None):
    """`path` and every file of the package it imports, directly or through other files.
    known: {file: its imports}, filled and reused across calls."""
    known = {} if known is None else known
    seen, todo = set(), [Path(path).resolve()]
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            if p not in known:
                known[p] = {q.resolve() for q in imports(p, root, package)}
            todo.extend(known[p])
    return seen


def saved_code_folder(source_folder):
    """Where Numba saves the machine code of a folder's files: its __pycache__, or NUMBA_CACHE_DIR's copy."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        from numba.core.caching import _CacheLocator

        subpath = _CacheLocator.get_suitable_cache_subpath(str(Path(source_folder) / "x.py"))
        return Path(os.environ["NUMBA_CACHE_DIR"]) / subpath
    return Path(source_folder) / "__pycache__"


def fingerprints(files, root=ROOT, package="course_lib"):
    """{file: fingerprint of the files it imports} for every file the kernel files' kernels may compile."""
    closures, known, text = {}, {}, {}
    for kernel_file in files:
        for f in imported_closure(kernel_file, root, package, known):
            if f not in closures:
                closures[f] = imported_closure(f, root, package, known)
    for f in set().union(*closures.values()) if closures else ():
        text[f] = f.read_bytes()
    return {f: hashlib.sha256(b"".join(text[p] for p in sorted(c - {f}))).hexdigest() for f, c in closures.items()}


def drop_stale_kernels(files=None, root=ROOT, package="course_lib"):
    """Delete the saved machine code of every file whose imported files changed since it was compiled
    (or whose fingerprint is unknown), and record the fingerprints as they are now.

    files: the kernel files to guard (default: `kernel_files()`). Returns the saved files deleted. A
    read-only install is left alone (Numba then caches elsewhere, or compiles in each process)."""
    files = kernel_files(root, package) if files is None else files
    by_folder = {}
    for f, fp in fingerprints(files, root, package).items():
        by_folder.setdefault(f.parent, {})[f.stem] = fp
    dropped = []
    for folder, now in by_folder.items():
        saved = saved_code_folder(folder)
        stamp = saved / "inlined.json"
        try:
            before = json.loads(stamp.read_text()) if stamp.exists() else {}
        except (OSError, ValueError):
            before = {}
        if before == now:
            continue
        try:
            for stem, fp in now.items():
                if before.get(stem) != fp:
                    for old in [*saved.glob(f"{stem}.*.nbi"), *saved.glob(f"{stem}.*.nbc")]:
                        old.unlink()
                        dropped.append(old)
            saved.mkdir(parents=True, exist_ok=True)
            (saved / "inlined.sha256").unlink(missing_ok=True)     # the fingerprint of an earlier version
            tmp = stamp.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(now, indent=1, sort_keys=True))
            os.replace(tmp, stamp)
        except OSError:
            continue
    return dropped
