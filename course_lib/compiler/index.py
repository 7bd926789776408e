"""The embedding's two ops as kernels: gather rows (forward) and scatter-add rows (backward).

Chapter 12's fused Embedding (the capstone GPT's) works in numpy (`weight[idx]`, `np.add.at`), outside the
backend, so the tracer would see it as an island. For that one op it knows better: the forward is `out[i] = weight[idx[i]]`, the
backward adds each position's gradient row into the row of its token, in the order of the positions (as
np.add.at does, so the sums round alike). Both check their indices, as numpy does.
"""

from numba import njit


@njit(cache=True)
def gather_rows(out, weight, idx, width):
    """out[i * width:(i + 1) * width] = weight[idx[i] * width:(idx[i] + 1) * width] for each position i."""
    rows = weight.size // width
    for i in range(idx.size):
        k = idx[i]
        if k < 0 or k >= rows:
            raise IndexError("embedding: an index is out of range of the weight's rows")
        out[i * width:(i + 1) * width] = weight[k * width:(k + 1) * width]


@njit(cache=True)
def scatter_add_rows(out, grad, idx, width):
    """out = zeros, then out[idx[i]] += grad[i] for each position i, in order."""
    rows = out.size // width
    out[:] = 0
    for i in range(idx.size):
        k = idx[i]
        if k < 0 or k >= rows:
            raise IndexError("embedding: an index is out of range of the weight's rows")
        row = out[k * width:(k + 1) * width]
        g = grad[i * width:(i + 1) * width]
        for j in range(width):
            row[j] += g[j]
