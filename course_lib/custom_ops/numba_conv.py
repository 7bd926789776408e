"""Conv2d as Numba kernels: the forward and both gradients, on numpy arrays, writing into `out`.

Shapes: x (N, C, H, W), w (O, C, KH, KW), out (N, O, OH, OW); stride, padding and dilation are
(h, w) pairs. The forward is the course's answer to exercise 08.7: read it once your check passes.
"""

import numba

# ---- convolution (cross-correlation, as in every deep learning framework) -------------------
#
# The loops are ordered so that the innermost one runs along an output row (j): for a stride of 1
# it reads x and writes out at stride 1, which the compiler turns into SIMD instructions (the
# kernels spell that case out, on row slices walked from 0: a stride known only at run time, or
# an index that might be negative (Numba then adds a wrap-around test), keeps the loop scalar). The
# padding is handled by `cols`, which gives the range of j whose tap lands inside the image, once
# per row instead of a test per element. (sh, sw), (ph, pw), (dh, dw) are the stride, padding and
# dilation along the rows (h) and along the columns (w).


@numba.njit(inline="always")
def cols(OW, W, stride, padding, dilation, q):
    """The j in [lo, hi) for which column v = j*stride - padding + q*dilation lies in [0, W)."""
    first = padding - q * dilation                      # v >= 0  <=>  j*stride >= first
    lo = max(0, -((-first) // stride))                  # ceil(first / stride)
    hi = min(OW, (W - 1 + first) // stride + 1)         # v <= W - 1
    return lo, max(lo, hi)


@numba.njit(parallel=True, cache=True)
def conv2d_forward(x, w, out, stride, padding, dilation):
    """The course's answer to exercise 08.7 (`conv2d_numba`): read it once your check passes.

    out[n, o, i, j] = sum_{c, p, q} w[o, c, p, q] * x[n, c, i*sh - ph + p*dh, j*sw - pw + q*dw]."""
    N, C, H, W = x.shape
    O, _, KH, KW = w.shape
    _, _, OH, OW = out.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    for no in numba.prange(N * O):                      # one (sample, out channel) per task
        n, o = no // O, no % O
        out[n, o] = 0.0
        for c in range(C):
            for p in range(KH):
                for q in range(KW):
                    wv = w[o, c, p, q]
                    lo, hi = cols(OW, W, sw, pw, dw, q)
                    shift = q * dw - pw
                    for i in range(OH):
                        h = i * sh - ph + p * dh
                        if 0 <= h < H and sw == 1:  # (a row of the padding adds 0)
                            o_row, x_row = out[n, o, i, lo:hi], x[n, c, h, lo + shift:hi + shift]
                            for j in range(hi - lo):    # from 0, unit stride: SIMD
                                o_row[j] += wv * x_row[j]
                        elif 0 <= h < H:
                            for j in range(lo, hi):
                                out[n, o, i, j] += wv * x[n, c, h, j * sw + shift]


@numba.njit(parallel=True, cache=True)
def conv2d_backward_input(dy, w, dx, stride, padding, dilation):
    """dx[n, c, h, v] = sum over the outputs (i, j) whose window touched (h, v) of dy * w.

    Each task owns one (n, c) plane of dx and scatters into it, so no two threads write the same place.
    """
    N, C, H, W = dx.shape
    O, _, KH, KW = w.shape
    _, _, OH, OW = dy.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    for nc in numba.prange(N * C):
        n, c = nc // C, nc % C
        dx[n, c] = 0.0
        for o in range(O):
            for p in range(KH):
                for q in range(KW):
                    wv = w[o, c, p, q]
                    lo, hi = cols(OW, W, sw, pw, dw, q)
                    shift = q * dw - pw
                    for i in range(OH):
                        h = i * sh - ph + p * dh
                        if 0 <= h < H and sw == 1:
                            dx_row, dy_row = dx[n, c, h, lo + shift:hi + shift], dy[n, o, i, lo:hi]
                            for j in range(hi - lo):
                                dx_row[j] += dy_row[j] * wv
                        elif 0 <= h < H:
                            for j in range(lo, hi):
                                dx[n, c, h, j * sw + shift] += dy[n, o, i, j] * wv


@numba.njit(parallel=True, fastmath={"reassoc", "contract"}, cache=True)
def conv2d_backward_weight(dy, x, dweight, stride, padding, dilation):
    """dweight[o, c, p, q] = sum over n, i, j of dy[n, o, i, j] * x[n, c, i*sh - ph + p*dh, j*sw - pw + q*dw].

    fastmath's reassociation lets the compiler split the sum over j into SIMD lanes.
    """
    N, C, H, W = x.shape
    O, _, KH, KW = dweight.shape
    _, _, OH, OW = dy.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    for oc in numba.prange(O * C):
        o, c = oc // C, oc % C
        for p in range(KH):
            for q in range(KW):
                lo, hi = cols(OW, W, sw, pw, dw, q)
                shift = q * dw - pw
                acc = 0.0
                for n in range(N):                          # summed over the batch
                    for i in range(OH):
                        h = i * sh - ph + p * dh
                        if 0 <= h < H and sw == 1:
                            dy_row, x_row = dy[n, o, i, lo:hi], x[n, c, h, lo + shift:hi + shift]
                            for j in range(hi - lo):
                                acc += dy_row[j] * x_row[j]
                        elif 0 <= h < H:
                            for j in range(lo, hi):
                                acc += dy[n, o, i, j] * x[n, c, h, j * sw + shift]
                dweight[o, c, p, q] = acc
