"""Checks for chapter 07, the CUDA puzzles and the matmul ladder.

Each check launches YOUR kernel through course_lib.cuda.launch (real-GPU limits, on a GPU or
on the simulator) on random inputs whose sizes are not multiples of the block, with outputs
pre-filled with NaN so an element nobody wrote shows up. Kernels that share memory are also run
by the tracer (course_lib/cuda/trace.py), which names any race: two threads of a block that touch
one address in the same barrier phase, one of them writing. The matmul ladder's checks then count,
with the tracer, the property each step is about: coalesced accesses, loads from global memory
per multiply-add, loads from shared memory per multiply-add and bank conflicts.
"""

import numpy as np

from course_lib.checks import CheckFailed, assert_close, exercise, rng
from course_lib.cuda.launch import LaunchError, blocks_for, launch
from course_lib.cuda.puzzles import k_add_offsets
from course_lib.cuda.trace import KernelTraceError, trace

GRID2_HINT = ("cuda.grid(2) returns (x, y), and x runs along the columns, the contiguous axis (Lesson 07, "
              "section 3): check which of your two indices picks the row.")


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
    return CheckFailed(f"{e}\n  hint: some threads have no element: the threads past the end of the array must not "
                       f"touch it (Lesson 07, section 2).")


def _sizes(low, high, not_multiple_of, k=3):
    out = []
    while len(out) < k:
        n = int(rng().integers(low, high + 1))
        if n % not_multiple_of:
            out.append(n)
    return out


RACE_HINT = ("a thread reads or writes shared memory that another thread writes, and nothing orders the two: a "
             "barrier must separate them, and in a loop the next step's writes must wait for this step's reads "
             "(Lesson 07, section 2).")


def _trace(kernel, grid, block, **arrays):
    """The tracer's run of your kernel (course_lib/cuda/trace.py); its complaints become CheckFailed."""
    try:
        return trace(kernel, grid, block, **arrays)
    except KernelTraceError as e:
        raise CheckFailed(f"the tracer stopped your kernel: {e}") from None


def _race_free(kernel, grid, block, what, **arrays):
    """Trace one launch and fail, naming the two threads and the lines, if two of them race."""
    t = _trace(kernel, grid, block, **arrays)
    races = t.races()
    if races:
        raise CheckFailed(f"{what}: a race at {len(races)} address(es), found by the tracer. The first: "
                          f"{t.describe_race(races[0])}.\n  hint: {RACE_HINT}")
    return t


def _shared_check(run_once, cases, expected_fn, what, traced, hint=None, mistakes_fn=None, rtol=1e-9):
    """Each case's values against numpy; the tracer's race check on the first case, first when a value differs
    (a race is the likelier cause), else after the values."""
    for i, case in enumerate(cases):
        out = run_once(*case)
        try:
            _compare(out, expected_fn(*case), what(*case), inputs=dict(zip("ab", case[:2])) if len(case) < 4 else None,
                     hint=hint, mistakes=mistakes_fn(*case) if mistakes_fn else None, rtol=rtol)
        except CheckFailed:
            traced(*case)
            raise
    traced(*cases[0])


# ---- 1. to 7.: one thread, one element ------------------------------------------------------

@exercise
def map_add10(your_kernel):
    """out[i] = a[i] + 10 with one block of exactly a.size threads."""
    for n in _sizes(3, 30, 4):
        a, out = rng().uniform(-5, 5, n), _nan_out(n)
        _run(your_kernel, 1, n, a, out)
        _compare(out, a + 10, f"out for n = {n}", inputs={"a": a},
                 mistakes={"your result is a + 1; the puzzle adds 10": a + 1})
    return "3 random sizes"


@exercise
def zip_add(your_kernel):
    """out[i] = a[i] + b[i]."""
    for n in _sizes(3, 30, 4):
        a, b, out = rng().uniform(-5, 5, n), rng().uniform(-5, 5, n), _nan_out(n)
        _run(your_kernel, 1, n, a, b, out)
        _compare(out, a + b, f"out for n = {n}", inputs={"a": a, "b": b},
                 mistakes={"your result is a added to itself; the puzzle adds b": 2 * a,
                           "your result is b added to itself; the puzzle adds a": 2 * b})
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


GUARD_2D = "guard both axes: a thread past the last row or past the last column must not touch the arrays"


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
            raise CheckFailed(f"{e}\n  hint: {GUARD_2D}; and {GRID2_HINT}") from None
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
            raise CheckFailed(f"{e}\n  hint: a has one column and b one row, so each has an axis of size 1 that only "
                              f"index 0 may touch; the guard follows out, the only array of full size.") from None
        _compare(out, a + b, f"out for a {rows}x1 column and a 1x{cols} row", inputs={"a": a, "b": b},
                 hint=GRID2_HINT)
    return "3 random non-square shapes"


BLOCK_SIZES = (8, 5, 16)                   # 1-D blocks: a kernel must read cuda.blockDim.x, not assume 8
BLOCKS_2D = ((4, 4), (8, 2), (3, 5))       # 2-D blocks, square and rectangular both ways


@exercise
def blocks_add10(your_kernel):
    """Many blocks of 8, then 5, then 16 threads: each thread's global index counts the blocks before its own."""
    for tpb in BLOCK_SIZES:
        n = _sizes(12, 45, tpb, k=1)[0]
        a, out = rng().uniform(-5, 5, n), _nan_out(n)
        try:
            _run(your_kernel, blocks_for(n, tpb), tpb, a, out)
        except CheckFailed as e:
            raise _guard_hint(e) from None
        first_only = np.where(np.arange(n) < tpb, a + 10, np.nan)
        _compare(out, a + 10, f"out for n = {n} ({blocks_for(n, tpb)} blocks of {tpb})", inputs={"a": a},
                 hint="every block covers its own chunk, which starts after the threads of all the blocks before it. "
                      f"The check launches blocks of {', '.join(map(str, BLOCK_SIZES))} threads: the kernel learns "
                      "the block's size from the launch; never write it as a number.",
                 mistakes={"only the first chunk is written: every block started at element 0": first_only})
    return f"3 random sizes, blocks of {', '.join(map(str, BLOCK_SIZES))} threads"


def _blocks_2d(i, rows, cols):
    bx, by = BLOCKS_2D[i]
    return (blocks_for(cols, bx), blocks_for(rows, by)), (bx, by)


@exercise
def blocks2d_add10(your_kernel):
    """A 2-D grid of 4x4, 8x2 and 3x5 blocks over a non-square matrix, with cuda.grid(2)."""
    _map2d(your_kernel, _blocks_2d, "out", hint=GRID2_HINT + " The blocks are not always square: the extent "
           "along x and the extent along y are two different numbers of the launch.")
    return "3 random non-square shapes, with 4x4, 8x2 and 3x5 blocks"


# ---- 8. to 13.: shared memory and barriers ----------------------------------------------------

def _reverse_blocks(a, tpb):
    return np.concatenate([a[s:s + tpb][::-1] for s in range(0, a.size, tpb)])


def _tracer_1d(kernel, tpb, what):
    """traced(a, ...) for _shared_check: your kernel under the tracer on that case, outputs NaN."""
    def traced(*case):
        outs = {"out": _nan_out(case[0].size)} if what != "dot" else {"partial": _nan_out(blocks_for(case[0].size, tpb))}
        if what == "scan":
            outs["block_sums"] = _nan_out(blocks_for(case[0].size, tpb))
        names = {"dot": "ab", "conv": ("a", "w")}.get(what, "a")
        _race_free(kernel, blocks_for(case[0].size, tpb), tpb, "the tracer's run", **dict(zip(names, case)), **outs)
    return traced


@exercise
def block_reverse(your_kernel, your_tpb):
    """Each block of tpb threads reverses its chunk of a (the last chunk may be shorter)."""
    def run_once(a):
        out = _nan_out(a.size)
        _run(your_kernel, blocks_for(a.size, your_tpb), your_tpb, a, out)
        return out

    cases = [(rng().uniform(-5, 5, n),) for n in _sizes(your_tpb + 1, 4 * your_tpb, your_tpb)]
    _shared_check(run_once, cases, lambda a: _reverse_blocks(a, your_tpb), lambda a: f"out for n = {a.size}",
                  _tracer_1d(your_kernel, your_tpb, "reverse"),
                  hint="the last block holds only a.size - start elements: reverse within those.",
                  mistakes_fn=lambda a: {"you reversed the whole array; reverse each block's chunk": a[::-1],
                                         "the last, partial block is reversed as if it were full":
                                         np.concatenate([_reverse_blocks(a[:a.size // your_tpb * your_tpb], your_tpb),
                                                         a[a.size // your_tpb * your_tpb:]])})
    return f"3 random sizes with {your_tpb} threads per block, and the tracer's race check"


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
        return {"a[-1] and a[-2] wrapped around to the end of the array: elements before the start count 0": wrapped,
                "each block starts from 0: the 2 elements before the block (the halo) are missing": per_block}

    cases = [(rng().uniform(-5, 5, n),) for n in _sizes(your_tpb + 3, 4 * your_tpb, your_tpb)]
    _shared_check(run_once, cases, _pool3_ref, lambda a: f"out for n = {a.size}",
                  _tracer_1d(your_kernel, your_tpb, "pool"), mistakes_fn=mistakes)
    return f"3 random sizes with {your_tpb} threads per block, and the tracer's race check"


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
        return {"only part of each block was summed: the tree stops before its last level (it has log2(TPB) levels)":
                np.array([(a * b)[s:s + your_tpb // 2].sum() for s in range(0, a.size, your_tpb)]),
                "you summed a + b; the dot product multiplies first": np.add.reduceat(a + b, np.arange(0, a.size, your_tpb))}

    cases = [(rng().uniform(-2, 2, n), rng().uniform(-2, 2, n)) for n in _sizes(your_tpb + 1, 4 * your_tpb, your_tpb)]
    _shared_check(run_once, cases, expected, lambda a, b: f"partial sums for n = {a.size}",
                  _tracer_1d(your_kernel, your_tpb, "dot"),
                  hint="threads past the end must contribute 0 to the sum, and each level of the tree must see the "
                       "previous level complete.", mistakes_fn=mistakes)
    return f"3 random sizes with {your_tpb} threads per block, and the tracer's race check"


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
        return {"the weights are flipped (that is np.convolve); the puzzle pairs a[i + k] with w[k]": flipped,
                "each block stops at its own end: the K-1 elements after the block (the halo) are missing": per_block}

    cases = []
    for n in _sizes(your_tpb + 2, 4 * your_tpb, your_tpb):
        k = int(rng().integers(2, your_max_k + 1))
        cases.append((rng().uniform(-2, 2, n), rng().uniform(-2, 2, k)))
    _shared_check(run_once, cases, _conv_ref, lambda a, w: f"out for n = {a.size}, K = {w.size}",
                  _tracer_1d(your_kernel, your_tpb, "conv"), mistakes_fn=mistakes)
    return "3 random sizes and kernel lengths, and the tracer's race check"


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
                  _tracer_1d(your_kernel, your_tpb, "scan"),
                  hint="at each step of Hillis and Steele every thread reads a neighbour's slot before any thread "
                       "overwrites it (Lesson 07, section 5).", mistakes_fn=mistakes)
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
    return "3 random sizes, the tracer's race check, and a prefix sum over several blocks"


@exercise
def row_sum(your_kernel, your_tpb):
    """One block per row of a (rows, cols) matrix: out[row] = a[row, :].sum()."""
    def run_once(a):
        out = _nan_out(a.shape[0])
        _run(your_kernel, a.shape[0], your_tpb, a, out)
        return out

    def traced(a):
        _race_free(your_kernel, a.shape[0], your_tpb, "the tracer's run", a=a, out=_nan_out(a.shape[0]))

    def mistakes(a):
        return {"only the first tpb columns were summed: a row is wider than the block, so each thread has "
                "several columns to add": a[:, :your_tpb].sum(1)}

    cases = [(rng().uniform(-2, 2, (int(rng().integers(2, 5)), c)),) for c in _sizes(your_tpb + 1, 4 * your_tpb, your_tpb)]
    _shared_check(run_once, cases, lambda a: a.sum(1), lambda a: f"row sums of a {a.shape[0]}x{a.shape[1]} matrix",
                  traced, mistakes_fn=mistakes)
    return "3 random shapes wider than a block, and the tracer's race check"


# ---- 14. to 17.: the matmul ladder ------------------------------------------------------------
# Each step is checked twice: its values on the simulator (or a GPU) for shapes that are not multiples
# of its tiles, and, with the tracer, the property that makes the step faster than the one below.

def _mat(r, c):
    return rng().uniform(-1, 1, (r, c)).astype(np.float32)


def _matmul_cases():
    cases = []
    for i in range(3):
        m, k, n = (int(v) for v in rng().integers(5, 22, size=3))
        while m == n:
            n = int(rng().integers(5, 22))
        if i == 0:  # rows and columns need different numbers of 8-wide blocks, else swapped x/y still covers C
            m, n = int(rng().integers(5, 9)), int(rng().integers(13, 22))
            m, n = (m, n) if rng().random() < 0.5 else (n, m)
        cases.append((_mat(m, k), _mat(k, n)))
    return cases


def _run_matmul(kernel, block, A, B, per_block=None):
    """C = kernel(A, B) on a grid that covers C with blocks computing per_block = (rows, cols) of C each
    (one element per thread by default)."""
    rows, cols = per_block or (block[1], block[0])
    C = np.full((A.shape[0], B.shape[1]), np.nan, np.float32)
    grid = (blocks_for(C.shape[1], cols), blocks_for(C.shape[0], rows))
    try:
        _run(kernel, grid, block, A, B, C)
    except CheckFailed as e:
        if "outside an array" not in str(e):
            raise
        raise CheckFailed(f"{e}\n  hint: the blocks at the right and bottom edges hang over C: their threads must "
                          f"not touch what lies outside the matrices. {GRID2_HINT}") from None
    return C


def _compare_matmul(C, A, B, what, mistakes=None, hint=None):
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    _compare(C, A64 @ B64, what, rtol=1e-4, atol=1e-5, hint=hint, mistakes=mistakes)


def _dropped_last_tile(A, B, bk):
    """C without the last, partial tile of K: the mistake of a K loop that stops at the last full tile."""
    full = A.shape[1] // bk * bk
    return A[:, :full].astype(np.float64) @ B[:full].astype(np.float64)


def _trace_matmul(kernel, block, per_block, A, B):
    """The tracer's run of a matmul kernel (race-free, or CheckFailed), and its profile."""
    rows, cols = per_block
    grid = (blocks_for(B.shape[1], cols), blocks_for(A.shape[0], rows))
    t = _race_free(kernel, grid, block, "the tracer's run", A=A, B=B, C=np.full((A.shape[0], B.shape[1]), np.nan,
                                                                             np.float32))
    return t, t.profile(multiply_adds=A.shape[0] * A.shape[1] * B.shape[1])


def _busiest(t, kind, shared):
    """(array, line, count) of the source line with the most accesses of a kind, in shared or global memory."""
    counts = {}
    for e in t.events:
        if e.kind == kind and (e.array in t.shared_names) == shared:
            counts[e.array, e.line] = counts.get((e.array, e.line), 0) + 1
    (array, line), n = max(counts.items(), key=lambda kv: kv[1])
    return f"{n} of them by line {line} (`{t.source_line(line)}`), on {array.split(' ')[0]}"


def _global_loads_ideal(M, N, K, BM, BN):
    """Loads of A and B when each block loads its BM rows of A and its BN columns of B once, edges clipped."""
    return M * K * blocks_for(N, BN) + K * N * blocks_for(M, BM)


SLACK = 1.25        # a step's count may exceed its ideal by a quarter (extra loads at the edges, say)


def _require_global_loads(t, p, M, N, K, BM, BN, step):
    ideal = _global_loads_ideal(M, N, K, BM, BN)
    if p.global_loads > SLACK * ideal:
        raise CheckFailed(
            f"C is right, but your kernel loads {p.global_loads} elements of A and B from global memory "
            f"({p.per_multiply_add(p.global_loads):.2f} per multiply-add) for A {(M, K)} @ B {(K, N)}, where blocks "
            f"of {BM}x{BN} outputs that load each element once need {ideal} "
            f"({ideal / (M * N * K):.2f} per multiply-add); {_busiest(t, 'read', shared=False)}.\n  hint: in {step}, "
            f"a block reads each element of its tiles from global memory once, into shared memory, and every "
            f"multiply-add then reads shared memory (Lesson 07, section 6).")


def _require_no_conflicts(p, step):
    per_access = p.wavefronts / max(p.shared_accesses, 1)
    if per_access > 1.5:
        (array, kind, line), ways = max(p.conflicts.items(), key=lambda kv: kv[1])
        raise CheckFailed(
            f"C is right, but your warps' shared-memory accesses conflict: on average each needs {per_access:.2f} "
            f"passes of shared memory instead of 1; the worst, {ways}-way, is a {kind} of {array.split(' ')[0]} at line "
            f"{line} (`{p.lines[line]}`).\n  hint: in {step}, the 32 threads of a warp should read words in 32 "
            f"different banks, or the very same word; which words a warp reads together depends on how the "
            f"threads' outputs are laid out, and on how the tile is stored (Lesson 07, section 7).")


def _require_shared_loads(t, p, executed, ideal, step, why):
    got = p.shared_loads / executed
    if got > SLACK * ideal:
        raise CheckFailed(
            f"C is right, but your kernel makes {got:.2f} loads from shared memory per multiply-add where {step} "
            f"needs {ideal:.2f}; {_busiest(t, 'read', shared=True)}.\n  hint: {why}")


@exercise
def matmul_naive(your_kernel):
    """C = A @ B, one thread per element of C, blocks of 8x8, then rectangular 16x4 and 4x8; and coalesced:
    the threads of a warp read and write neighbouring addresses."""
    for (A, B), block in zip(_matmul_cases(), ((8, 8), (16, 4), (4, 8))):
        C = _run_matmul(your_kernel, block, A, B)
        _compare_matmul(C, A, B, f"C for A {A.shape} @ B {B.shape}, blocks of {block[0]}x{block[1]}",
                        hint=GRID2_HINT + " The blocks are not always square: the extent along x and the extent "
                        "along y are two different numbers of the launch.",
                        mistakes={"the sum over k stops one term short": A.astype(np.float64) @ B - np.outer(A[:, -1], B[-1])})
    # Coalescing: blocks of 32 x 2, so each warp is 32 threads along x.
    A, B = _mat(int(rng().integers(5, 9)), int(rng().integers(5, 9))), None
    B = _mat(A.shape[1], int(rng().integers(33, 40)))
    t, p = _trace_matmul(your_kernel, (32, 2), (2, 32), A, B)
    if p.uncoalesced:
        (array, kind, line), (got, need) = max(p.uncoalesced.items(), key=lambda kv: kv[1][0] / kv[1][1])
        raise CheckFailed(
            f"C is right, but {p.uncoalesced_count} of your warps' {p.global_accesses} accesses to global memory are "
            f"not coalesced (blocks of 32 x 2, A {A.shape} @ B {B.shape}): the worst, a {kind} of {array} at line "
            f"{line} (`{p.lines[line]}`), touches {got} 32-byte sectors for {need} sector(s) of data.\n  hint: the 32 "
            f"threads of a warp are consecutive along x; in a row-major matrix, neighbouring addresses lie along a row "
            f"(Lesson 07, section 7).")
    return "3 random non-square shapes, with 8x8, 16x4 and 4x8 blocks; coalesced, counted by the tracer"


@exercise
def matmul_tiled(your_kernel, your_tile):
    """C = A @ B with tile x tile shared-memory tiles; K is never a multiple of the tile. Each element of
    a tile is loaded from global memory once per block (about 2 / tile loads per multiply-add)."""
    T = your_tile
    cases = [(_mat(m, k), _mat(k, n)) for k, (m, n) in (
        (int(rng().integers(2, T)), rng().choice(np.arange(5, 2 * T), size=2, replace=False)),   # K < one tile
        (T + int(rng().integers(1, T)), rng().choice(np.arange(5, 2 * T), size=2, replace=False)),
        (2 * T + int(rng().integers(1, T)), rng().choice(np.arange(5, 2 * T), size=2, replace=False)))]
    for i, (A, B) in enumerate(cases):
        C = _run_matmul(your_kernel, (T, T), A, B)
        try:
            _compare_matmul(C, A, B, f"C for A {A.shape} @ B {B.shape} with {T}x{T} tiles",
                            mistakes={"the last, partial tile of K was dropped: K is not a multiple of the tile, and "
                                      "the part of a tile past the edge counts as 0": _dropped_last_tile(A, B, T)})
        except CheckFailed:
            _trace_matmul(your_kernel, (T, T), (T, T), A, B)          # a race, named, explains it best
            raise
    A, B = cases[2]
    t, p = _trace_matmul(your_kernel, (T, T), (T, T), A, B)
    _require_global_loads(t, p, A.shape[0], B.shape[1], A.shape[1], T, T, "the tiled kernel")
    _require_no_conflicts(p, "the tiled kernel")
    return ("3 random shapes (K < tile, K between tiles); the tracer: no race, each element of a tile loaded "
            "once per block, no bank conflicts")


def _ladder_case(BM, BN, BK):
    """A shape that is not a multiple of the tiles: C spans 2 blocks each way, K 1 or 2 tiles and a part."""
    m = BM + int(rng().integers(1, BM))
    n = BN + int(rng().integers(1, BN))
    k = int(rng().integers(1, 3)) * BK + int(rng().integers(1, BK))
    return _mat(m, k), _mat(k, n)


def _executed(M, N, K, BM, BN, BK):
    """Multiply-adds a blocked kernel runs, the zeros past the edges included."""
    return blocks_for(M, BM) * BM * blocks_for(N, BN) * BN * blocks_for(K, BK) * BK


def _ladder_values(kernel, block, per_block, bk, A, B, sizes):
    """C from a launch (on the simulator or a GPU) against numpy, then the tracer's run of the same case
    (a race there explains wrong values best): returns (trace, profile)."""
    C = _run_matmul(kernel, block, A, B, per_block)
    try:
        _compare_matmul(C, A, B, f"C for A {A.shape} @ B {B.shape}, {sizes}",
                        mistakes={"the last, partial tile of K was dropped: K is not a multiple of BK, and the part of "
                                  "a tile past the edge counts as 0": _dropped_last_tile(A, B, bk)})
    except CheckFailed:
        _trace_matmul(kernel, block, per_block, A, B)
        raise
    return _trace_matmul(kernel, block, per_block, A, B)


MATMUL_1D_SIZES = ((16, 16, 4, 4), (8, 16, 4, 2))           # (BM, BN, BK, TM): two shapes of tile


@exercise
def matmul_1d(your_kernel_for):
    """1D register blocking: your_kernel_for(BM, BN, BK, TM) returns a kernel whose blocks of (BN, BM // TM)
    threads each compute a BM x BN tile of C, each thread TM elements of one column in registers. Checked for
    two sets of sizes: the values, no race, one shared load of B per TM multiply-adds."""
    for BM, BN, BK, TM in MATMUL_1D_SIZES:
        kernel, block = your_kernel_for(BM, BN, BK, TM), (BN, BM // TM)
        A, B = _ladder_case(BM, BN, BK)
        t, p = _ladder_values(kernel, block, (BM, BN), BK, A, B, f"BM, BN, BK, TM = {BM}, {BN}, {BK}, {TM}")
        M, K, N = A.shape[0], A.shape[1], B.shape[1]
        _require_global_loads(t, p, M, N, K, BM, BN, "1D blocking")
        _require_shared_loads(t, p, _executed(M, N, K, BM, BN, BK), 1 + 1 / TM, "1D blocking",
                              "for each k, a thread's TM multiply-adds share one element of B: read it from shared "
                              "memory once, into a register, and reuse it (Lesson 07, section 8).")
    return (f"sizes {MATMUL_1D_SIZES[0]} and {MATMUL_1D_SIZES[1]}, a random shape each; the tracer: no race, "
            f"tiles loaded once per block, at most 1 + 1/TM shared loads per multiply-add")


MATMUL_2D_SIZES = ((32, 32, 8, 4, 4), (16, 32, 4, 2, 4))    # (BM, BN, BK, TM, TN)


@exercise
def matmul_2d(your_kernel_for):
    """2D register blocking: your_kernel_for(BM, BN, BK, TM, TN) returns a kernel whose blocks of
    (BN // TN, BM // TM) threads each compute a BM x BN tile of C, each thread a TM x TN block of it in
    registers. Checked for two sets of sizes: the values, no race, (TM + TN) shared loads per TM * TN
    multiply-adds, and warps that read shared memory without bank conflicts."""
    for BM, BN, BK, TM, TN in MATMUL_2D_SIZES:
        kernel, block = your_kernel_for(BM, BN, BK, TM, TN), (BN // TN, BM // TM)
        A, B = _ladder_case(BM, BN, BK)
        t, p = _ladder_values(kernel, block, (BM, BN), BK, A, B, f"BM, BN, BK, TM, TN = {BM}, {BN}, {BK}, {TM}, {TN}")
        M, K, N = A.shape[0], A.shape[1], B.shape[1]
        _require_global_loads(t, p, M, N, K, BM, BN, "2D blocking")
        _require_shared_loads(t, p, _executed(M, N, K, BM, BN, BK), 1 / TM + 1 / TN, "2D blocking",
                              "for each k, a thread's TM x TN multiply-adds use TM elements of A and TN of B: each "
                              "is read from shared memory once, into registers, and reused (Lesson 07, section 8).")
        _require_no_conflicts(p, "2D blocking")
    return (f"sizes {MATMUL_2D_SIZES[0]} and {MATMUL_2D_SIZES[1]}, a random shape each; the tracer: no race, "
            f"tiles loaded once per block, at most 1/TM + 1/TN shared loads per multiply-add, no bank conflicts")
