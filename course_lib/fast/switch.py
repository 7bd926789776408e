"""One compiled function that runs op number `code` of a table of scalar functions.

A kernel that serves every op takes the op as a small integer, its code, and branches on it.
`switch(scalar_ops.MAP, "x")` writes that branch from the table, so the codes are the table's
own positions and no list of ops is ever written twice:

    def switch(code, x):
        if code == 0:
            return op0(x)        # op0 = njit(scalar_ops.identity)
        if code == 1:
            return op1(x)        # op1 = njit(scalar_ops.neg)
        ...
        return op11(x)           # the last op needs no test

The branch is the same for every element, so the CPU predicts it perfectly; where the code is a
constant of the kernel (fast/ops.py's flat kernels), LLVM folds the branch away.
Each scalar function is compiled once, with `cache=True` (cached next to scalar_ops.py).
"""

from numba import njit

JIT = dict(cache=True, error_model="numpy")  # numpy's errors: 1/0 gives inf instead of raising


def switch(table, args):
    """A compiled `switch(code, <args>)` returning `list(table.values())[code](<args>)`."""
    funcs = list(table.values())
    scope = {f"op{code}": njit(**JIT)(f) for code, f in enumerate(funcs)}
    lines = [f"def switch(code, {args}):"]
    lines += [f"    if code == {code}:\n        return op{code}({args})" for code in range(len(funcs) - 1)]
    lines += [f"    return op{len(funcs) - 1}({args})"]
    exec("\n".join(lines), scope)
    return njit(inline="always", error_model="numpy")(scope["switch"])
