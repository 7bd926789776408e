"""fast/cache.py: Numba's saved machine code, for every package of the course, is dropped when a file its
kernels inline changes (Numba itself watches only the file that defines a kernel), and only when the
course's entry points ask: importing the package deletes nothing. Every test works on temporary copies,
never on the package's real cache."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import course_lib
from course_lib.fast import cache

LIB = Path(course_lib.__file__).parent


def library_copy(tmp_path):
    """A copy of course_lib without its saved code, and the environment of a process that imports it."""
    shutil.copytree(LIB, tmp_path / "course_lib", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_DISABLE_JIT", "NUMBA_CACHE_DIR")}
    return tmp_path / "course_lib", env | {"PYTHONPATH": str(tmp_path), "COURSE_COMPILER_CACHE": str(tmp_path / "generated")}


def test_the_search_finds_every_package_that_compiles_with_cache_and_what_its_kernels_inline(tmp_path):
    generated = tmp_path / "generated"
    generated.mkdir()
    (generated / "k_0123.py").write_text("from numba import njit\n\nfrom course_lib.compiler.scalar import vexp\n\n"
                                         "@njit(cache=True)\ndef kernel(x):\n    return vexp(x)\n")
    files = cache.kernel_files(generated=generated)
    names = {f.relative_to(LIB).as_posix() if LIB in f.parents else f.name for f in files}
    assert {"fast/matmul.py", "fast/plans.py", "fused/attention_cpu.py", "fused/scan_cpu.py", "simd/tiles.py",
            "custom_ops/numba_kernels.py", "compiler/index.py", "yours/numba_backend.py", "k_0123.py"} <= names
    guarded = {f.relative_to(LIB).as_posix() if LIB in f.parents else f.name for f in cache.fingerprints(files)}
    # the files whose functions the kernels may compile, each with a fingerprint of what it imports
    assert {"tensor/scalar_ops.py", "tensor/tensor_data.py", "simd/fastexp.py", "simd/tiles.py",
            "compiler/scalar.py", "k_0123.py"} <= guarded
    inlined = {p.name for p in cache.imported_closure(LIB / "fused" / "attention_cpu.py")}
    assert {"tiles.py", "fastexp.py"} <= inlined


def test_an_edit_of_an_inlined_file_changes_only_the_fingerprints_of_its_importers(tmp_path):
    lib, _ = library_copy(tmp_path)
    files = [lib / "fused" / "attention_cpu.py", lib / "fused" / "scan_cpu.py", lib / "fast" / "plans.py"]
    before = cache.fingerprints(files, root=tmp_path)
    with open(lib / "simd" / "tiles.py", "a") as f:
        f.write("\n# an edit\n")
    after = cache.fingerprints(files, root=tmp_path)
    changed = {f.relative_to(lib).as_posix() for f in before if before[f] != after[f]}
    assert changed == {"fused/attention_cpu.py"}


def test_a_changed_inlined_file_drops_the_saved_code_and_an_unchanged_one_keeps_it(tmp_path):
    (tmp_path / "helper.py").write_text("def f(x):\n    return x + 1.0\n")
    (tmp_path / "kernel.py").write_text("import helper\n")
    files, saved = [tmp_path / "kernel.py"], tmp_path / "__pycache__"
    saved.mkdir()
    for name in ("kernel.g-3.py311.nbi", "kernel.g-3.py311.1.nbc", "helper.f-1.py311.nbi"):
        (saved / name).write_text("machine code")
    dropped = cache.drop_stale_kernels(files, root=tmp_path, package="helper")   # no fingerprint yet: drop, stamp
    assert sorted(p.name for p in dropped) == ["helper.f-1.py311.nbi", "kernel.g-3.py311.1.nbc", "kernel.g-3.py311.nbi"]
    (saved / "kernel.g-3.py311.nbi").write_text("machine code")
    assert not cache.drop_stale_kernels(files, root=tmp_path, package="helper")        # the same sources: keep
    with open(tmp_path / "helper.py", "a") as f:                                      # as by a `git pull`
        f.write("\n# an edit\n")
    assert [p.name for p in cache.drop_stale_kernels(files, root=tmp_path, package="helper")] == ["kernel.g-3.py311.nbi"]


def test_importing_the_package_deletes_nothing(tmp_path):
    """A copy of the library whose fused/__pycache__ holds code under a stale stamp: importing the kernels
    (in a fresh process, on the copy) leaves it there; the declared function then drops it."""
    lib, env = library_copy(tmp_path)
    saved = lib / "fused" / "__pycache__"
    saved.mkdir()
    (saved / "inlined.json").write_text('{"attention_cpu": "an older fingerprint"}')
    (saved / "attention_cpu.forward_tile-69.py311.nbi").write_text("machine code")
    env["NUMBA_DISABLE_JIT"] = "1"
    importing = "import course_lib.fused.attention_cpu, course_lib.fast.plans, course_lib.fast.cache"
    subprocess.run([sys.executable, "-c", importing], cwd=tmp_path, env=env, check=True)
    assert (saved / "attention_cpu.forward_tile-69.py311.nbi").exists()
    dropping = importing + "; assert course_lib.fast.cache.drop_stale_kernels()"
    subprocess.run([sys.executable, "-c", dropping], cwd=tmp_path, env=env, check=True)
    assert not (saved / "attention_cpu.forward_tile-69.py311.nbi").exists()


def test_an_edit_of_a_helper_the_fused_kernels_inline_recompiles_once_the_declared_function_runs(tmp_path):
    """The failure it prevents, on a copy of the library: fused/attention_cpu.py's cached tiles_transposed
    inlines simd/tiles.py's transpose. Editing tiles.py alone leaves Numba loading the old machine code;
    after drop_stale_kernels the next process compiles the new code."""
    lib, env = library_copy(tmp_path)
    run = textwrap.dedent("""
        import sys
        import numpy as np
        from course_lib.fast.cache import drop_stale_kernels
        if sys.argv[1] == "guarded":
            drop_stale_kernels()
        from course_lib.fused.attention_cpu import tiles_transposed
        print(tiles_transposed(np.arange(6.0).reshape(1, 3, 2), 2).sum())
    """)

    def total(how):
        done = subprocess.run([sys.executable, "-c", run, how], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip()

    assert total("guarded") == "15.0"
    tiles = lib / "simd" / "tiles.py"
    tiles.write_text(tiles.read_text().replace("out[j, i] = a[i, j]", "out[j, i] = 2 * a[i, j]"))
    assert total("unguarded") == "15.0"        # Numba alone: the stale machine code of tiles_transposed still runs
    assert total("guarded") == "30.0"          # dropped: compiled afresh with the edited transpose


def test_the_guard_looks_where_the_compiler_writes_its_kernels(tmp_path, monkeypatch):
    from course_lib.compiler import kernels

    monkeypatch.setenv("COURSE_COMPILER_CACHE", str(tmp_path / "generated"))
    assert cache.compiler_folder() == kernels.cache_dir()
    monkeypatch.delenv("COURSE_COMPILER_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache.compiler_folder() == kernels.cache_dir()
