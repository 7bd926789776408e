"""fast/cache.py: Numba's saved machine code is dropped when a file its kernels inline changes (Numba itself
watches only the file that defines a kernel), and only when the course's entry points ask: importing the
package deletes nothing. Every test works on temporary copies, never on the package's real cache."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import course_lib
from course_lib.fast import cache

RUN = [sys.executable, "-c", "import kernel; print(kernel.g(1.0))"]


def test_a_changed_inlined_file_drops_the_saved_code_and_an_unchanged_one_keeps_it(tmp_path):
    sources = [shutil.copy(p, tmp_path / p.name) for p in cache.INLINED[:2]]  # scalar_ops.py, tensor_data.py
    saved = tmp_path / "__pycache__"
    saved.mkdir()
    for name in ("ops.unary-1.py311.nbi", "ops.unary-1.py311.1.nbc"):
        (saved / name).write_text("machine code")
    assert cache.drop_stale_kernels(saved, sources)          # no fingerprint yet: drop, and stamp
    assert sorted(p.name for p in saved.iterdir()) == ["inlined.sha256"]
    (saved / "flat.kernel-1.py311.nbi").write_text("machine code")
    assert not cache.drop_stale_kernels(saved, sources)      # the same sources: keep
    assert (saved / "flat.kernel-1.py311.nbi").exists()
    with open(sources[0], "a") as f:                        # scalar_ops.py edited, as by a `git pull`
        f.write("\n# an edit\n")
    assert cache.drop_stale_kernels(saved, sources)
    assert not (saved / "flat.kernel-1.py311.nbi").exists()


def test_the_package_fingerprint_covers_the_inlined_files():
    names = [p.name for p in cache.INLINED]
    assert names[:2] == ["scalar_ops.py", "tensor_data.py"] and {"ops.py", "flat.py", "indexing.py"} <= set(names)


def test_importing_the_package_deletes_nothing(tmp_path):
    """A copy of the library whose fast/__pycache__ holds code under a stale stamp: importing the backend
    (in a fresh process, on the copy) leaves it there; the declared function then drops it."""
    shutil.copytree(Path(course_lib.__file__).parent, tmp_path / "course_lib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    saved = tmp_path / "course_lib" / "fast" / "__pycache__"
    saved.mkdir()
    (saved / "inlined.sha256").write_text("an older fingerprint")
    (saved / "ops.kernel-1.py311.nbi").write_text("machine code")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "NUMBA_DISABLE_JIT": "1"}
    importing = "import course_lib.fast.backend, course_lib.fast.plans, course_lib.fast.cache"
    subprocess.run([sys.executable, "-c", importing], cwd=tmp_path, env=env, check=True)
    assert (saved / "ops.kernel-1.py311.nbi").exists()
    dropping = importing + "; assert course_lib.fast.cache.drop_stale_kernels()"
    subprocess.run([sys.executable, "-c", dropping], cwd=tmp_path, env=env, check=True)
    assert not (saved / "ops.kernel-1.py311.nbi").exists()


def test_an_edit_of_an_inlined_file_recompiles_once_the_declared_function_runs(tmp_path):
    """The failure it prevents, on a two-file package of its own: kernel.py's cached kernel inlines
    helper.py's function. Editing helper.py alone leaves Numba loading the old machine code; after
    drop_stale_kernels the next process compiles the new code."""
    (tmp_path / "helper.py").write_text("def f(x):\n    return x + 1.0\n")
    (tmp_path / "kernel.py").write_text(textwrap.dedent("""
        from numba import njit
        import helper
        f = njit(inline="always")(helper.f)

        @njit(cache=True)
        def g(x):
            return f(x)
    """))
    sources, saved = [tmp_path / "helper.py", tmp_path / "kernel.py"], tmp_path / "__pycache__"
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_DISABLE_JIT", "NUMBA_CACHE_DIR")}

    def run():
        return subprocess.run(RUN, cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()

    cache.drop_stale_kernels(saved, sources)
    assert run() == "2.0"
    (tmp_path / "helper.py").write_text("def f(x):\n    return x + 2.0\n")
    assert run() == "2.0"                       # Numba alone: the stale machine code still runs
    assert cache.drop_stale_kernels(saved, sources)
    assert run() == "3.0"                       # dropped: compiled afresh from the edited helper
