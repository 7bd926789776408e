"""Chapter 06: fast CPU kernels with Numba, and a Numba backend for the chapter 02 tensor engine.

One idea per file:
    position.py  where element i of a strided view lives in flat storage
    indexing.py  position compiled and inlined; broadcast strides; fresh and flat views
    switch.py    one compiled function that runs op number `code` of tensor/scalar_ops.py's table
    ops.py       the scalar ops by code, and parallel strided map, zip, reduce and where kernels
    flat.py      per-op kernels for contiguous operands (full, row, column or one number), vectorized
    matmul.py    a parallel, tiled, batched matmul (how a fast matmul is built)
    blas.py      the backend's matmul: numpy's BLAS, so that one BLAS thread pool serves the process
    adam.py      Adam's whole update in one pass over the parameters (a fused optimizer kernel)
    pool.py      how many threads a call runs on: one for small work, the whole pool for big work
    backend.py   the four kernels behind chapter 02's backend interface: `set_backend("numba")`;
                 contiguous operands run a flat kernel, any other view a strided one
    plans.py     the backend's speed layer: each call's plan worked out once per shape, numpy's SIMD
                 math for exp, log, tanh and sigmoid, one thread or the pool
    cache.py     Numba's saved machine code, dropped when a file it inlined has changed

The course's answers to chapter 06's exercises are here, each marked with the exercise it answers:
position.py (06.2), ops.py (06.5 and 06.9), matmul.py (06.6), flat.py (06.7, 06.8 and 06.10) and
blas.py (06.11). Read them once your checks pass.

Every kernel is compiled with `cache=True`, so the next Python process loads its machine code instead
of compiling again; cache.py says why the course's commands check that code before they run anything.
"""
