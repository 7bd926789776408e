"""Chapter 06: fast CPU kernels with Numba, and a Numba backend for the chapter 02 tensor engine.

One idea per file:
    indexing.py  where element i of a strided view lives in flat storage (compiled, inlined)
    ops.py       the scalar ops by name, parallel strided map, zip and reduce kernels, and flat
                 per-op kernels for contiguous operands
    matmul.py    a parallel, tiled, batched matmul
    backend.py   the four kernels behind chapter 02's backend interface: `set_backend("numba")`

Every kernel is compiled with `cache=True`: the machine code is saved next to this package
(in `__pycache__`), so the next Python process loads it instead of compiling again. Editing a
file changes its hash and recompiles that file's kernels.
"""
