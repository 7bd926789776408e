"""Checks for chapter 07, the CUDA puzzles.

Each check launches YOUR kernel through course_lib.cuda.launch (real-GPU limits, on a GPU or
on the simulator) on random inputs whose sizes are not multiples of the block, with outputs
pre-filled with NaN so an element nobody wrote shows up. Kernels that share memory are run
on several inputs and once more on the first, so a missing `cuda.syncthreads()` (a race)
is caught even when it happens to give the right answer once.
"""

import numpy as np

from course_lib.checks import CheckFailed, assert_close, exercise, rng
from course_lib.cuda.launch import LaunchError, blocks_for, launch
from course_lib.cuda.puzzles import k_add_offsets

GRID2_HINT = ("cuda.grid(2) returns (x, y), and x runs along the columns: write `col, row = cuda.grid(2)` "
              "and index `out[row, col]`.")


def _run(kernel, grid, block, *args):
    """Launch, turning a refused launch or an out-of-bounds index into CheckFailed."""
    try:
        launch(kernel, grid, block, *args)
    except LaunchError as e:
        raise CheckFailed(f"the launch was refused: {e}") from None
    except IndexError as e:              # the simulator checks every index
        raise CheckFailed(f"a thread read or wrote outside an array: {e}") from None


def _nan_out(shape):
    return np.full(shape, np.nan)


def _compare(yours, expected, what, inputs=None, hint=None, mistakes=None, rtol=1e-9, atol=1e-9):
    __tracebackhide__ = True
    y = np.asarray(yours)
    if y.shape == np.shape(expected) and np.isnan(y).any():
        idx = tuple(int(i) for i in np.argwhere(np.isnan(y))[0])
        raise CheckFailed(f"{what}: {int(np.isnan(y).sum())} of {y.size} output elements were never written "
                          f"(first at index {idx}).\n  hint: {hint or 'too few threads, or a guard that is too strict?'}")
    assert_close(yours, expected, what=what, rtol=rtol, atol=atol, inputs=inputs, hint=hint, mistakes=mistakes)


def _guard_hint(e):
    return CheckFailed(f"{e}\n  hint: some threads have no element: guard the body with `if i < a.size:`.")


def _sizes(low, high, not_multiple_of, k=3):
    out = []
    while len(out) < k:
        n = int(rng().integers(low, high + 1))
        if n % not_multiple_of:
            out.append(n)
    return out


RACE_HINT = ("a thread reads shared memory that another thread writes: put `cuda.syncthreads()` between "
             "the writes and the reads (and, in a loop, before the next writes).")


def _differ(x, y):
    return not np.array_equal(np.nan_to_num(x, nan=7.25), np.nan_to_num(y, nan=7.25))


def _compare_or_race(run_once, case, out, compare):
    """Compare; on a mismatch run the same case again, and call it a race if the answer changed."""
    __tracebackhide__ = True
    try:
        compare(out)
    except CheckFailed as e:
        if _differ(run_once(*case), out):
            raise CheckFailed(f"the same input gave different results on two runs: a race.\n  hint: {RACE_HINT}"
                              f"\n  first run: {e}") from None
        # The simulator runs a block's threads in turn and may reuse the same shared buffer, so a
        # missing barrier can also give the same wrong answer twice.
        raise CheckFailed(f"{e}\n  hint: if the mistake is not in the arithmetic, it may be a race that gave the "
                          f"same wrong answer twice: {RACE_HINT}") from None


def _race_check(run_once, case, first_result, what):
    """Run the first case again: a kernel without its barriers can give different answers."""
    if _differ(run_once(*case), first_result):
        raise CheckFailed(f"{what}: the same input gave different results on two runs: a race."
                          f"\n  hint: {RACE_HINT}")


# ---- 1. to 7.: one thread, one element ------------------------------------------------------

@exercise
def map_add10(your_kernel):
    """out[i] = a[i] + 10 with one block of exactly a.size threads."""
    for n in _sizes(3, 30, 4):
        a, out = rng().uniform(-5, 5, n), _nan_out(n)
        _run(your_kernel, 1, n, a, out)
        _compare(out, a + 10, f"out for n = {n}", inputs={"a": a},
                 mistakes={"you wrote a[i] + 1; the puzzle adds 10": a + 1})
    return "3 random sizes"


@exercise
def zip_add(your_kernel):
    """out[i] = a[i] + b[i]."""
    for n in _sizes(3, 30, 4):
        a, b, out = rng().uniform(-5, 5, n), rng().uniform(-5, 5, n), _nan_out(n)
        _run(your_kernel, 1, n, a, b, out)
        _compare(out, a + b, f"out for n = {n}", inputs={"a": a, "b": b},
                 mistakes={"you added a to itself; add b": 2 * a, "you added b to itself; add a": 2 * b})
    return "3 random sizes"


@exercise
def guard_add10(your_kernel):
    """More threads than elements: out[i] = a[i] + 10 only where i < a.size."""
    for n in _sizes(3, 30, 8):
        a, out = rng().uniform(-5, 5, n), _nan_out(n)
        try:
            _run(your_kernel, 1, blocks_for(n, 8) * 8 + 8, a, out)
        except CheckFailed as e:
            raise _guard_hint(e) from None
        _compare(out, a + 10, f"out for n = {n}", inputs={"a": a})
    return "3 random sizes, up to 15 idle threads each"


def _map2d(kernel, config, what, hint=GRID2_HINT):
    """Three random non-square matrices; config(i, rows, cols) gives case i's (grid, block)."""
    for i in range(3):
        rows, cols = int(rng().integers(3, 8)), int(rng().integers(9, 14))
        if rng().random() < 0.5:
            rows, cols = cols, rows                      # tall and wide, never square
        a, out = rng().uniform(-5, 5, (rows, cols)), _nan_out((rows, cols))
        grid, block = config(i, rows, cols)
        try:
            _run(kernel, grid, block, a, out)
        except CheckFailed as e:
            raise CheckFailed(f"{e}\n  hint: guard both axes, `if row < a.shape[0] and col < a.shape[1]`; "
                              + GRID2_HINT) from None
        _compare(out, a + 10, f"{what} for a {rows}x{cols} input, blocks of {block[0]}x{block[1]}",
                 inputs={"a": a}, hint=hint)
    return "3 random non-square shapes"


@exercise
def map2d_add10(your_kernel):
    """One 2-D block of (x = columns + 1, y = rows + 2) threads: out[row, col] = a[row, col] + 10."""
    return _map2d(your_kernel, lambda i, r, c: (1, (c + 1, r + 2)), "out")


@exercise
def broadcast_add(your_kernel):
    """out[row, col] = a[row, 0] + b[0, col], one 2-D block a little larger than out."""
    for _ in range(3):
        rows, cols = int(rng().integers(3, 8)), int(rng().integers(9, 14))
        if rng().random() < 0.5:
            rows, cols = cols, rows
        a, b, out = rng().uniform(-5, 5, (rows, 1)), rng().uniform(-5, 5, (1, cols)), _nan_out((rows, cols))
        try:
            _run(your_kernel, 1, (cols + 2, rows + 1), a, b, out)
        except CheckFailed as e:
            raise CheckFailed(f"{e}\n  hint: a has one column and b one row: read a[row, 0] and b[0, col], "
                              f"and guard with out.shape.") from None
        _compare(out, a + b, f"out for a {rows}x1 column and a 1x{cols} row", inputs={"a": a, "b": b},
                 hint=GRID2_HINT)
    return "3 random non-square shapes"


BLOCK_SIZES = (8, 5, 16)                   # 1-D blocks: a kernel must read cuda.blockDim.x, not assume 8
BLOCKS_2D = ((4, 4), (8, 2), (3, 5))       # 2-D blocks, square and rectangular both ways


@exercise
def blocks_add10(your_kernel):
    """Many blocks of 8, then 5, then 16 threads: i = blockIdx.x * blockDim.x + threadIdx.x."""
    for tpb in BLOCK_SIZES:
        n = _sizes(12, 45, tpb, k=1)[0]
        a, out = rng().uniform(-5, 5, n), _nan_out(n)
        try:
            _run(your_kernel, blocks_for(n, tpb), tpb, a, out)
        except CheckFailed as e:
            raise _guard_hint(e) from None
        first_only = np.where(np.arange(n) < tpb, a + 10, np.nan)
        _compare(out, a + 10, f"out for n = {n} ({blocks_for(n, tpb)} blocks of {tpb})", inputs={"a": a},
                 hint="every block covers its own chunk: i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x. "
                      f"The check launches blocks of {', '.join(map(str, BLOCK_SIZES))} threads: read the block "
                      "size from cuda.blockDim.x, never write it as a number.",
                 mistakes={"only the first chunk is written: add blockIdx.x * blockDim.x": first_only})
    return f"3 random sizes, blocks of {', '.join(map(str, BLOCK_SIZES))} threads"


def _blocks_2d(i, rows, cols):
    bx, by = BLOCKS_2D[i]
    return (blocks_for(cols, bx), blocks_for(rows, by)), (bx, by)


@exercise
def blocks2d_add10(your_kernel):
    """A 2-D grid of 4x4, 8x2 and 3x5 blocks over a non-square matrix, with cuda.grid(2)."""
    _map2d(your_kernel, _blocks_2d, "out", hint=GRID2_HINT + " The blocks are not always square: take x with "
           "blockDim.x and y with blockDim.y, or let cuda.grid(2) do it.")
    return "3 random non-square shapes, with 4x4, 8x2 and 3x5 blocks"


# ---- 8. to 13.: shared memory and barriers ----------------------------------------------------

def _shared_check(run_once, cases, expected_fn, what, hint=None, mistakes_fn=None, rtol=1e-9):
    first = None
    for case in cases:
        out = run_once(*case)
        first = out if first is None else first
        _compare_or_race(run_once, case, out, lambda y: _compare(
            y, expected_fn(*case), what(*case), inputs=dict(zip("ab", case[:2])) if len(case) < 4 else None,
            hint=hint, mistakes=mistakes_fn(*case) if mistakes_fn else None, rtol=rtol))
    _race_check(run_once, cases[0], first, what(*cases[0]))


def _reverse_blocks(a, tpb):
    return np.concatenate([a[s:s + tpb][::-1] for s in range(0, a.size, tpb)])


@exercise
def block_reverse(your_kernel, your_tpb):
    """Each block of tpb threads reverses its chunk of a (the last chunk may be shorter)."""
    def run_once(a):
        out = _nan_out(a.size)
        _run(your_kernel, blocks_for(a.size, your_tpb), your_tpb, a, out)
        return out

    cases = [(rng().uniform(-5, 5, n),) for n in _sizes(your_tpb + 1, 4 * your_tpb, your_tpb)]
    _shared_check(run_once, cases, lambda a: _reverse_blocks(a, your_tpb), lambda a: f"out for n = {a.size}",
                  hint="the last block holds only a.size - start elements: reverse within those.",
                  mistakes_fn=lambda a: {"you reversed the whole array; reverse each block's chunk": a[::-1],
                                         "the last, partial block is reversed as if it were full":
                                         np.concatenate([_reverse_blocks(a[:a.size // your_tpb * your_tpb], your_tpb),
                                                         a[a.size // your_tpb * your_tpb:]])})
    return f"3 random sizes with {your_tpb} threads per block, and a rerun for races"


def _pool3_ref(a):
    out = a.copy()
    out[1:] += a[:-1]
    out[2:] += a[:-2]
    return out


@exercise
def pool3(your_kernel, your_tpb):
    """out[i] = a[i-2] + a[i-1] + a[i] (terms before the start count 0), through shared memory."""
    def run_once(a):
        out = _nan_out(a.size)
        _run(your_kernel, blocks_for(a.size, your_tpb), your_tpb, a, out)
        return out

    def mistakes(a):
        wrapped = a + np.roll(a, 1) + np.roll(a, 2)
        per_block = np.concatenate([_pool3_ref(a[s:s + your_tpb]) for s in range(0, a.size, your_tpb)])
        return {"a[-1] and a[-2] wrapped around to the end of the array: treat them as 0": wrapped,
                "each block starts from 0: load the 2 elements before the block (the halo) too": per_block}

    cases = [(rng().uniform(-5, 5, n),) for n in _sizes(your_tpb + 3, 4 * your_tpb, your_tpb)]
    _shared_check(run_once, cases, _pool3_ref, lambda a: f"out for n = {a.size}", mistakes_fn=mistakes)
    return f"3 random sizes with {your_tpb} threads per block, and a rerun for races"


@exercise
def dot_partial(your_kernel, your_tpb):
    """partial[b] = sum of a[i] * b[i] over block b's chunk, by a tree reduction in shared memory."""
    def run_once(a, b):
        partial = _nan_out(blocks_for(a.size, your_tpb))
        _run(your_kernel, partial.size, your_tpb, a, b, partial)
        return partial

    def expected(a, b):
        return np.add.reduceat(a * b, np.arange(0, a.size, your_tpb))

    def mistakes(a, b):
        return {"only part of each block was summed: the tree must run until step 0 (TPB/2, TPB/4, ... 1)":
                np.array([(a * b)[s:s + your_tpb // 2].sum() for s in range(0, a.size, your_tpb)]),
                "you summed a + b; multiply first": np.add.reduceat(a + b, np.arange(0, a.size, your_tpb))}

    cases = [(rng().uniform(-2, 2, n), rng().uniform(-2, 2, n)) for n in _sizes(your_tpb + 1, 4 * your_tpb, your_tpb)]
    _shared_check(run_once, cases, expected, lambda a, b: f"partial sums for n = {a.size}",
                  hint="threads past the end must put 0 in shared memory; sum with a barrier after each level.",
                  mistakes_fn=mistakes)
    return f"3 random sizes with {your_tpb} threads per block, and a rerun for races"


def _conv_ref(a, w):
    padded = np.concatenate([a, np.zeros(w.size - 1)])
    return np.array([padded[i:i + w.size] @ w for i in range(a.size)])


@exercise
def conv1d(your_kernel, your_tpb, your_max_k):
    """out[i] = sum_k a[i + k] * w[k], with a read as 0 past its end."""
    def run_once(a, w):
        out = _nan_out(a.size)
        _run(your_kernel, blocks_for(a.size, your_tpb), your_tpb, a, w, out)
        return out

    def mistakes(a, w):
        flipped = _conv_ref(a, w[::-1])
        per_block = np.concatenate([_conv_ref(a[s:s + your_tpb], w) for s in range(0, a.size, your_tpb)])
        return {"the weights are flipped (that is np.convolve); use a[i + k] * w[k]": flipped,
                "each block stops at its own end: load the K-1 elements after the block (the halo) too": per_block}

    cases = []
    for n in _sizes(your_tpb + 2, 4 * your_tpb, your_tpb):
        k = int(rng().integers(2, your_max_k + 1))
        cases.append((rng().uniform(-2, 2, n), rng().uniform(-2, 2, k)))
    _shared_check(run_once, cases, _conv_ref, lambda a, w: f"out for n = {a.size}, K = {w.size}",
                  mistakes_fn=mistakes)
    return "3 random sizes and kernel lengths, and a rerun for races"


@exercise
def block_scan(your_kernel, your_tpb):
    """Inclusive scan inside each block, and the block's total in block_sums; then the full
    prefix sum built from it (block scans, a scan of the totals, offsets)."""
    def run_once(a):
        out, sums = _nan_out(a.size), _nan_out(blocks_for(a.size, your_tpb))
        _run(your_kernel, sums.size, your_tpb, a, out, sums)
        return np.concatenate([out, sums])

    def expected(a):
        starts = np.arange(0, a.size, your_tpb)
        local = np.concatenate([np.cumsum(a[s:s + your_tpb]) for s in starts])
        return np.concatenate([local, np.add.reduceat(a, starts)])

    def mistakes(a):
        e = expected(a)
        exclusive = np.concatenate([np.cumsum(a[s:s + your_tpb]) - a[s:s + your_tpb] for s in range(0, a.size, your_tpb)])
        return {"that is the exclusive scan (each sum leaves out its own element)":
                np.concatenate([exclusive, e[a.size:]])}

    cases = [(rng().uniform(-2, 2, n),) for n in _sizes(your_tpb + 1, 3 * your_tpb, your_tpb)]
    _shared_check(run_once, cases, expected,
                  lambda a: f"[block scans of out, then block_sums] for n = {a.size}",
                  hint="Hillis-Steele: at each step read buf[t - step] into a local, syncthreads, add, syncthreads.",
                  mistakes_fn=mistakes)
    # The whole prefix sum over several blocks, with your kernel for the block scans.
    a = rng().uniform(-2, 2, int(your_tpb * rng().integers(3, 6) + rng().integers(1, your_tpb)))

    def scan(x):
        nb = blocks_for(x.size, your_tpb)
        out, sums = np.empty_like(x), np.empty(nb)
        _run(your_kernel, nb, your_tpb, x, out, sums)
        if nb > 1:
            _run(k_add_offsets, nb, your_tpb, out, scan(sums))
        return out

    _compare(scan(a), np.cumsum(a), f"the full prefix sum of {a.size} elements", rtol=1e-9, atol=1e-8)
    return "3 random sizes, a rerun for races, and a prefix sum over several blocks"


@exercise
def row_sum(your_kernel, your_tpb):
    """One block per row of a (rows, cols) matrix: out[row] = a[row, :].sum()."""
    def run_once(a):
        out = _nan_out(a.shape[0])
        _run(your_kernel, a.shape[0], your_tpb, a, out)
        return out

    def mistakes(a):
        return {"only the first tpb columns were summed: loop over col = t, t + tpb, t + 2*tpb, ...":
                a[:, :your_tpb].sum(1)}

    cases = [(rng().uniform(-2, 2, (int(rng().integers(2, 5)), c)),) for c in _sizes(your_tpb + 1, 4 * your_tpb, your_tpb)]
    _shared_check(run_once, cases, lambda a: a.sum(1), lambda a: f"row sums of a {a.shape[0]}x{a.shape[1]} matrix",
                  mistakes_fn=mistakes)
    return "3 random shapes wider than a block, and a rerun for races"


# ---- 14. and 15.: matrix multiply -------------------------------------------------------------

def _matmul_cases():
    cases = []
    for i in range(3):
        m, k, n = (int(v) for v in rng().integers(5, 22, size=3))
        while m == n:
            n = int(rng().integers(5, 22))
        if i == 0:  # rows and columns need different numbers of 8-wide blocks, else swapped x/y still covers C
            m, n = int(rng().integers(5, 9)), int(rng().integers(13, 22))
            m, n = (m, n) if rng().random() < 0.5 else (n, m)
        cases.append((rng().uniform(-1, 1, (m, k)).astype(np.float32),
                      rng().uniform(-1, 1, (k, n)).astype(np.float32)))
    return cases


def _run_matmul(kernel, block, A, B):
    C = np.full((A.shape[0], B.shape[1]), np.nan, np.float32)
    grid = (blocks_for(C.shape[1], block[0]), blocks_for(C.shape[0], block[1]))
    try:
        _run(kernel, grid, block, A, B, C)
    except CheckFailed as e:
        raise CheckFailed(f"{e}\n  hint: guard with C.shape; {GRID2_HINT}") from None
    return C


@exercise
def matmul_naive(your_kernel):
    """C = A @ B, one thread per element of C, blocks of 8x8, then rectangular 16x4 and 4x8."""
    for (A, B), block in zip(_matmul_cases(), ((8, 8), (16, 4), (4, 8))):
        C = _run_matmul(your_kernel, block, A, B)
        ref = A.astype(np.float64) @ B.astype(np.float64)
        _compare(C, ref, f"C for A {A.shape} @ B {B.shape}, blocks of {block[0]}x{block[1]}", rtol=1e-4,
                 atol=1e-5, hint=GRID2_HINT + " The blocks are not always square: use cuda.grid(2), or "
                 "blockDim.x for x and blockDim.y for y.",
                 mistakes={"the k loop stops one short: range(A.shape[1])": ref - np.outer(A[:, -1], B[-1])})
    return "3 random non-square shapes, with 8x8, 16x4 and 4x8 blocks"


@exercise
def matmul_tiled(your_kernel, your_tile):
    """C = A @ B with tile x tile shared-memory tiles; K is never a multiple of the tile."""
    def mat(r, c):
        return rng().uniform(-1, 1, (r, c)).astype(np.float32)

    first, cases = None, []
    for k in (int(rng().integers(2, your_tile)),                       # K smaller than one tile
              your_tile + int(rng().integers(1, your_tile)),                # one full tile and a partial one
              2 * your_tile + int(rng().integers(1, your_tile))):           # two full tiles and a partial one
        m, n = (int(v) for v in rng().choice(np.arange(5, 2 * your_tile), size=2, replace=False))
        cases.append((mat(m, k), mat(k, n)))
    run_once = lambda A, B: _run_matmul(your_kernel, (your_tile, your_tile), A, B)
    for A, B in cases:
        C = run_once(A, B)
        first = C if first is None else first
        A64, B64 = A.astype(np.float64), B.astype(np.float64)
        full = A.shape[1] // your_tile * your_tile
        _compare_or_race(run_once, (A, B), C, lambda y: _compare(
            y, A64 @ B64, f"C for A {A.shape} @ B {B.shape} with {your_tile}x{your_tile} tiles", rtol=1e-4, atol=1e-5,
            mistakes={"the last, partial tile of K was dropped: loop over ceil(K / TILE) tiles and load "
                      "0 past the edge": A64[:, :full] @ B64[:full]}))
    _race_check(run_once, cases[0], first, "C")
    return f"{len(cases)} random shapes (K < tile, K between tiles), and a rerun for races"
