"""Tile products for the attention kernels: small matrix products whose sums stay in registers.

    matmul_bt(a, b, out, n, m, k, accumulate)    out[:n, :m] (+)= a[:n, :k] @ b[:m, :k].T
    matmul(a, b, out, n, m, k, accumulate)       out[:n, :m] (+)= a[:n, :k] @ b[:k, :m]
    matmul(a, b, out, n, m, k, accumulate, True)     the same with a[:k, :n].T in place of a
    transpose(a, out, n, m)                      out[:m, :n] = a[:n, :m].T
    row_max(row, n, start)                       max(start, row[0], ..., row[n - 1]), in 8 running maxes

FlashAttention is two matrix products per tile with a softmax between them. On a GPU the products go
to tensor cores; here they are ours, in Numba, and this file is what makes them fast. (`np.dot`
inside a Numba kernel would call a second copy of OpenBLAS, scipy's, whose thread pool fights
numpy's for the cores: see chapter 06.)

The product is written as dot products: out[i, j] = sum over x of a[i, x] * b[j, x], where row i of
a and row j of b are both contiguous, so the loop over x vectorizes (with the `reassoc` flag, LLVM
may split the sum into 8 lanes). One dot product at a time loads two numbers per multiply-add, and
the CPU can load only two numbers per cycle: half its multiply-add units sit idle. Blocking fixes
that: 4 rows of a against 2 rows of b in one loop keep 8 sums going, load 6 vectors for 8 multiply-
adds, and every number loaded is used 2 or 4 times. On one core of an AVX2 machine this reaches about
45 GFLOP/s for 64 x 64 x 64 float32 tiles, near numpy's BLAS on the same tiles (about 47).

Every array must be C-contiguous: slicing the leading rows (`k[h, j0:]`) keeps a view contiguous,
slicing columns does not, and a non-contiguous view makes the same loop about 6x slower (LLVM cannot
assume that consecutive x are neighbours in memory). That is why the sizes n, m, k are arguments:
the callers keep whole buffers and say how much of each to use.
A product that needs a.T or b.T (P^T dO in the backward needs P^T) gets it from `transpose` first:
moving n * m numbers costs far less than the n * m * k multiply-adds of the product.

The other way round: `matmul`. matmul_bt ends every dot product by adding up its vector's lanes (a few
shuffles and adds for each number of out), which costs little when the sum is long (k = 256) and a lot
when it is as short as a head (k = 64: 4 to 8 vector multiply-adds per number, then the lane sum). `matmul`
vectorizes along a row of out instead: out[i, j:j+8] += a[i, x] * b[x, j:j+8], one number of a times
a row of b, so no lanes are ever added up. It needs b's rows contiguous, and a's numbers one at a time:
4 rows of out times 4 steps of the sum hold 16 numbers of a in registers, and each pass over the row
loads 4 vectors of b and 4 of out, for 16 multiply-adds, and stores 4. With a_t = True it reads a
transposed, a[x, i] for a[i, x], so that P^T V needs no copy of P.
"""

import numba

FASTMATH = {"reassoc", "contract", "nsz", "arcp"}   # reorder sums (SIMD), fuse multiply-adds; keep inf and NaN


@numba.njit(fastmath=FASTMATH, cache=True)
def matmul_bt(a, b, out, n, m, k, accumulate):
    """out[:n, :m] = a[:n, :k] @ b[:m, :k].T, or += when accumulate. All three C-contiguous 2-D arrays."""
    zero = a.dtype.type(0)
    n4, m2 = n - n % 4, m - m % 2
    for i in range(0, n4, 4):                       # blocks of 4 rows of a ...
        for j in range(0, m2, 2):                   # ... against 2 rows of b: 8 sums in registers
            if accumulate:                          # start from what out holds, or from 0
                s00, s01, s10, s11 = out[i, j], out[i, j + 1], out[i + 1, j], out[i + 1, j + 1]
                s20, s21, s30, s31 = out[i + 2, j], out[i + 2, j + 1], out[i + 3, j], out[i + 3, j + 1]
            else:
                s00 = s01 = s10 = s11 = s20 = s21 = s30 = s31 = zero
            for x in range(k):
                b0, b1 = b[j, x], b[j + 1, x]
                s00 += a[i, x] * b0
                s01 += a[i, x] * b1
                s10 += a[i + 1, x] * b0
                s11 += a[i + 1, x] * b1
                s20 += a[i + 2, x] * b0
                s21 += a[i + 2, x] * b1
                s30 += a[i + 3, x] * b0
                s31 += a[i + 3, x] * b1
            out[i, j], out[i, j + 1], out[i + 1, j], out[i + 1, j + 1] = s00, s01, s10, s11
            out[i + 2, j], out[i + 2, j + 1], out[i + 3, j], out[i + 3, j + 1] = s20, s21, s30, s31
        if m2 < m:                                  # the last row of b when m is odd
            for r in range(i, i + 4):
                _dot_into(a, b, out, r, m - 1, k, accumulate)
    for r in range(n4, n):                          # the last n % 4 rows of a
        for j in range(m):
            _dot_into(a, b, out, r, j, k, accumulate)


@numba.njit(fastmath=FASTMATH, cache=True)
def matmul(a, b, out, n, m, k, accumulate, a_t=False):
    """out[:n, :m] = A @ b[:k, :m], or += when accumulate, where A is a[:n, :k], or a[:k, :n].T when a_t.
    All three C-contiguous 2-D arrays."""
    n4, k4 = n - n % 4, k - k % 4
    for i in range(0, n4, 4):                       # blocks of 4 rows of out ...
        if not accumulate:                          # zeroed block by block, while its rows are in the cache
            for r in range(i, i + 4):
                for j in range(m):
                    out[r, j] = 0
        for x in range(0, k4, 4):                   # ... and 4 steps of the sum: 16 numbers of A
            a00, a01, a02, a03 = _four(a, i, x, a_t)
            a10, a11, a12, a13 = _four(a, i + 1, x, a_t)
            a20, a21, a22, a23 = _four(a, i + 2, x, a_t)
            a30, a31, a32, a33 = _four(a, i + 3, x, a_t)
            for j in range(m):                      # vectorized along the rows of b and out
                b0, b1, b2, b3 = b[x, j], b[x + 1, j], b[x + 2, j], b[x + 3, j]
                out[i, j] += a00 * b0 + a01 * b1 + a02 * b2 + a03 * b3
                out[i + 1, j] += a10 * b0 + a11 * b1 + a12 * b2 + a13 * b3
                out[i + 2, j] += a20 * b0 + a21 * b1 + a22 * b2 + a23 * b3
                out[i + 3, j] += a30 * b0 + a31 * b1 + a32 * b2 + a33 * b3
        for r in range(i, i + 4):                   # the last k % 4 steps of the sum
            _row_into(a, b, out, r, k4, k, m, a_t)
    for r in range(n4, n):                          # the last n % 4 rows of out
        if not accumulate:
            for j in range(m):
                out[r, j] = 0
        _row_into(a, b, out, r, 0, k, m, a_t)


@numba.njit(inline="always")
def _at(a, i, x, a_t):
    return a[x, i] if a_t else a[i, x]


@numba.njit(inline="always")
def _four(a, i, x, a_t):
    """A[i, x .. x + 3]: four numbers of row i of A, which is a or a.T."""
    return _at(a, i, x, a_t), _at(a, i, x + 1, a_t), _at(a, i, x + 2, a_t), _at(a, i, x + 3, a_t)


@numba.njit(fastmath=FASTMATH, inline="always")
def _row_into(a, b, out, i, x0, x1, m, a_t):
    for x in range(x0, x1):
        ax = _at(a, i, x, a_t)
        for j in range(m):
            out[i, j] += ax * b[x, j]


@numba.njit(fastmath=FASTMATH, inline="always")
def _dot_into(a, b, out, i, j, k, accumulate):
    s = a.dtype.type(0)
    for x in range(k):
        s += a[i, x] * b[j, x]
    out[i, j] = out[i, j] + s if accumulate else s


@numba.njit(cache=True)
def transpose(a, out, n, m):
    """out[:m, :n] = a[:n, :m].T, in blocks of 16 x 16. Row by row, every write of a long row would land
    in another cache line; a block touches 16 lines of a and 16 of out, and its loops have a length LLVM
    knows (16), so it unrolls them. The rows and columns past the last whole block go one by one."""
    n16, m16 = n - n % 16, m - m % 16
    for i0 in range(0, n16, 16):
        for j0 in range(0, m16, 16):
            for j in range(j0, j0 + 16):
                for i in range(i0, i0 + 16):
                    out[j, i] = a[i, j]
    for i in range(n16):
        for j in range(m16, m):
            out[j, i] = a[i, j]
    for i in range(n16, n):
        for j in range(m):
            out[j, i] = a[i, j]


@numba.njit(fastmath=FASTMATH, cache=True)
def row_max(row, n, start):
    """max(start, row[0], ..., row[n - 1]), start when n <= 0, in 8 running maxes. LLVM leaves a loop of
    `max` scalar (it does not vectorize this reduction, fastmath or not), so a single running max waits
    at each element for the comparison before it; 8 of them, over every 8th element, keep 8 in flight."""
    if n <= 0:
        return start
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = start
    n8 = n - n % 8
    for j in range(0, n8, 8):
        m0, m1, m2, m3 = max(m0, row[j]), max(m1, row[j + 1]), max(m2, row[j + 2]), max(m3, row[j + 3])
        m4, m5, m6, m7 = max(m4, row[j + 4]), max(m5, row[j + 5]), max(m6, row[j + 6]), max(m7, row[j + 7])
    for j in range(n8, n):
        m0 = max(m0, row[j])
    return max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
