"""Exercise 10.5's check proves the staging with chapter 07's tracer.

A kernel with the right numbers that reads each key's rows of k and v from global memory for every query
(no shared tile), or stages k but not v, is refused with its count of reads per key and block against
the one row a staged block needs. The course's kernel passes, and so does a correct kernel written
differently: every thread loads a strided share of the tile's numbers (not one row each), and each
tile's scores get their max in a first pass and their exponentials in a second.
"""

import math

import numba
from checking import expect_failure, expect_pass

from course_lib import device

device.setup(verbose=False)

from numba import cuda, float64  # noqa: E402  (after the device is chosen)

from course_lib.checks import ch10 as check  # noqa: E402
from course_lib.fused import attention_cuda  # noqa: E402

TILE, D_MAX = 8, 16
TILE_NUMBERS = TILE * D_MAX


@cuda.jit
def strided_tiles(q, k, v, out, lse, scale, causal):
    """Right, staged, and written differently from the course's kernel."""
    h, t = cuda.blockIdx.x, cuda.threadIdx.x
    first_query = cuda.blockIdx.y * TILE
    Tq, d, Tk, dv = q.shape[1], q.shape[2], k.shape[1], v.shape[2]
    row = first_query + t
    keys = cuda.shared.array((TILE, D_MAX), float64)
    values = cuda.shared.array((TILE, D_MAX), float64)
    scores = cuda.local.array(TILE, float64)
    total = cuda.local.array(D_MAX, float64)
    for c in range(D_MAX):
        total[c] = 0.0
    best, norm = -math.inf, 0.0
    stop = Tk
    if causal:
        stop = min(Tk, first_query + TILE + Tk - Tq)
    for start in range(0, stop, TILE):
        for n in range(t, TILE_NUMBERS, TILE):          # a strided share of the tile's numbers
            j, c = n // D_MAX, n % D_MAX
            keys[j, c] = k[h, start + j, c] if start + j < Tk and c < d else 0.0
            values[j, c] = v[h, start + j, c] if start + j < Tk and c < dv else 0.0
        cuda.syncthreads()
        if row < Tq:
            limit = min(TILE, Tk - start)
            if causal:
                limit = min(limit, row + Tk - Tq + 1 - start)
            tile_max = -math.inf
            for j in range(limit):                      # first pass: scores and their max
                dot = 0.0
                for c in range(d):
                    dot += q[h, row, c] * keys[j, c]
                scores[j] = scale * dot
                tile_max = max(tile_max, scores[j])
            new_best = max(best, tile_max)
            shrink = math.exp(best - new_best)
            norm = norm * shrink
            for c in range(dv):
                total[c] = total[c] * shrink
            for j in range(limit):                      # second pass: the weights
                weight = math.exp(scores[j] - new_best)
                norm += weight
                for c in range(dv):
                    total[c] += weight * values[j, c]
            best = new_best
        cuda.syncthreads()
    if row < Tq:
        for c in range(dv):
            out[h, row, c] = total[c] / norm
        lse[h, row] = best + math.log(norm)


def unstaged(stage_keys):
    """Right numbers; each thread reads v (and k too unless stage_keys) straight from global memory."""

    @cuda.jit
    def kernel(q, k, v, out, lse, scale, causal):
        h, t = cuda.blockIdx.x, cuda.threadIdx.x
        i = cuda.blockIdx.y * TILE + t
        Tq, d, Tk, dv = q.shape[1], q.shape[2], k.shape[1], v.shape[2]
        keys = cuda.shared.array((TILE, D_MAX), float64)
        acc = cuda.local.array(D_MAX, float64)
        for c in range(dv):
            acc[c] = 0.0
        m, den = -math.inf, 0.0
        for j0 in range(0, Tk, TILE):
            if stage_keys and j0 + t < Tk:
                for c in range(d):
                    keys[t, c] = k[h, j0 + t, c]
            cuda.syncthreads()
            if i < Tq:
                for j in range(j0, min(Tk, j0 + TILE)):
                    if causal and j > i + Tk - Tq:
                        break
                    s = 0.0
                    for c in range(d):
                        s += q[h, i, c] * (keys[j - j0, c] if stage_keys else k[h, j, c])
                    s *= scale
                    m_new = max(m, s)
                    alpha, p = math.exp(m - m_new), math.exp(s - m_new)
                    den = den * alpha + p
                    for c in range(dv):
                        acc[c] = acc[c] * alpha + p * v[h, j, c]
                    m = m_new
            cuda.syncthreads()
        if i < Tq:
            for c in range(dv):
                out[h, i, c] = acc[c] / den
            lse[h, i] = m + math.log(den)

    return kernel


def test_the_course_kernel_and_one_written_differently_pass():
    expect_pass(check.flash_forward_cuda, attention_cuda.kernels(numba.float64)[0], attention_cuda.TILE)
    expect_pass(check.flash_forward_cuda, strided_tiles, TILE)


def test_reading_k_and_v_from_global_memory_for_every_query_is_refused_with_its_count():
    # 8 queries a block each read a key's 4 + 3 numbers: 56 reads per key and block where staging needs 7
    message = expect_failure(check.flash_forward_cuda, unstaged(stage_keys=False), TILE,
                             match="out and lse are right, but your kernel reads 56.0 numbers of k and v")
    assert "per key and block" in message and "reads 7 (its 4 numbers of k and 3 of v)" in message
    assert "shared memory" in message


def test_staging_k_but_not_v_is_refused():
    message = expect_failure(check.flash_forward_cuda, unstaged(stage_keys=True), TILE, match="reads 28.0 numbers")
    assert message.split("of the reads are by line")[1].split("\n")[0].endswith("on v.")
