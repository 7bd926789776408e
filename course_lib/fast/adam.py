"""Adam's whole update in one pass over the parameters: the Numba backend's fused optimizer kernel.

Written with tensor ops (tensor/optim.py), one Adam step is about a dozen elementwise ops. Each is a
pass over every parameter, with a temporary array and a Python call of its own. This kernel reads
p, g, m and v once, updates m and v in place and writes the new p: one pass, no temporaries, one
call. (PyTorch's `Adam(fused=True)` does the same.) It computes in float64 and rounds once, when it
stores.

`optim.Adam` calls `backend.adam` when the current backend has one: only this backend does.
"""

import functools
import math

import numpy as np
from numba import njit, prange

from course_lib.fast.switch import JIT

BLOCK = 4096  # parameters per parallel iteration


@functools.cache
def fused_adam(decoupled, per_parameter, parallel=False):
    """A kernel for Adam (decoupled=False: weight decay folded into g) or AdamW (decay applied to p).

    decay holds one number (per_parameter=False) or one per parameter; c1 and c2 are the bias
    corrections 1 - b1^t and 1 - b2^t. As in flat.py, each block works on slices indexed by the
    loop counter alone, so that LLVM vectorizes the loop (one element at a time, it runs about ten
    times slower: the divisions and the square root then go one by one)."""
    loop = prange if parallel else range

    @njit(parallel=parallel, **JIT)
    def kernel(new_p, p, g, m, v, decay, lr, b1, b2, eps, c1, c2):
        size = p.size
        for blk in loop((size + BLOCK - 1) // BLOCK):
            lo = blk * BLOCK
            n = min(BLOCK, size - lo)
            out, pb, gb, mb, vb = new_p[lo:lo + n], p[lo:lo + n], g[lo:lo + n], m[lo:lo + n], v[lo:lo + n]
            db = decay[lo:lo + n] if per_parameter else decay[:1]
            for i in range(n):
                wd = db[i] if per_parameter else db[0]
                pi, gi = np.float64(pb[i]), np.float64(gb[i])
                if decoupled:
                    pi = pi * (1.0 - lr * wd)
                else:
                    gi = gi + wd * pi
                mi = b1 * mb[i] + (1.0 - b1) * gi
                vi = b2 * vb[i] + (1.0 - b2) * (gi * gi)
                mb[i] = mi
                vb[i] = vi
                out[i] = pi - lr * (mi / c1) / (math.sqrt(vi / c2) + eps)
    return kernel
