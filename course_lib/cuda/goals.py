"""What each chapter 07 exercise's kernel must do, as pictures: `goal("pool3")`.

A goal traces the course's own kernel for the exercise with the tracer of trace.py, at the exercise's
block sizes and on fixed inputs, and draws which thread reads and writes which element: a picture of
what the kernel does, never its code. It never runs the learner's kernel.
"""

import numpy as np

from course_lib.cuda.trace import _ndim, rebind, trace


def _goals(tpb, tile):
    """name -> (grid, block, arrays, pictures). A picture is ("draw", draw's options) or ("steps", array)."""
    r = np.random.default_rng(7)

    def u(*shape):
        return r.uniform(-1, 1, shape).round(2)

    def nan(*shape):
        return np.full(shape, np.nan)

    n, nb = 2 * tpb + 3, 3                        # three blocks, the last one partial
    xy = {"label": "xy"}
    return {
        "map_add10": (1, 6, dict(a=u(6), out=nan(6)), [("draw", {})]),
        "zip_add": (1, 6, dict(a=u(6), b=u(6), out=nan(6)), [("draw", {})]),
        "guard_add10": (1, 8, dict(a=u(5), out=nan(5)), [("draw", {"note": "threads 5 to 7 touch nothing"})]),
        "map2d_add10": (1, (6, 5), dict(a=u(3, 5), out=nan(3, 5)), [("draw", xy)]),
        "broadcast_add": (1, (7, 4), dict(a=u(3, 1), b=u(1, 5), out=nan(3, 5)), [("draw", xy)]),
        "blocks_add10": (nb, tpb, dict(a=u(n), out=nan(n)), [("draw", {})]),
        "blocks2d_add10": ((2, 2), (4, 4), dict(a=u(5, 7), out=nan(5, 7)), [("draw", xy)]),
        "block_reverse": (nb, tpb, dict(a=u(n), out=nan(n)),
                          [("draw", {"arrays": ["a", "buf (shared, block 2)", "out"]})]),
        "pool3": (nb, tpb, dict(a=u(n), out=nan(n)), [("draw", {"arrays": ["a", "buf (shared, block 1)", "out"]})]),
        "dot_partial": (nb, tpb, dict(a=u(n), b=u(n), partial=nan(nb)),
                        [("draw", {"arrays": ["a", "b", "partial"]}), ("steps", "buf (shared, block 0)")]),
        "conv1d": (nb, tpb, dict(a=u(n), w=u(3), out=nan(n)),
                   [("draw", {"arrays": ["a", "w", "tile (shared, block 1)", "out"],
                              "note": "here w has 3 weights"})]),
        "block_scan": (nb, tpb, dict(a=u(n), out=nan(n), block_sums=nan(nb)),
                       [("draw", {"arrays": ["a", "out", "block_sums"]}), ("steps", "buf (shared, block 0)")]),
        "row_sum": (3, tpb, dict(a=u(3, n), out=nan(3)),
                    [("draw", {"arrays": ["a", "out"], "note": "block b sums row b"}),
                     ("steps", "buf (shared, block 0)")]),
        "matmul_naive": ((2, 2), (8, 8), dict(A=u(10, 6), B=u(6, 11), C=nan(10, 11)),
                         [("draw", {"highlight": (1, 10), "label": "xy", "arrays": ["A", "B", "C"],
                                    "note": "only thread (2,1) of block (1,0), out of 256"})]),
        "matmul_tiled": (1, (tile, tile), dict(A=u(3, tile + 3), B=u(tile + 3, 5), C=nan(3, 5)),
                         [("draw", {"label": "xy", "color": "phase", "arrays": ["A", "B", "C"],
                                    "note": "one block over a 3x5 C\ncolour = barrier "
                                    "phase (each tile of K is loaded in its own phase)"})]),
        "matmul_1d": (1, (16, 4), dict(A=u(13, 10), B=u(10, 14), C=nan(13, 14)),
                      [("draw", {"color": "phase", "kinds": ("read",), "arrays": ["A", "B"],
                                 "note": "BM, BN, BK, TM = 16, 16, 4, 4: one block over a 13x14 C\ncolour = barrier "
                                         "phase: the block loads a 16x4 tile of A and a 4x16 tile of B per step"})]),
        "matmul_2d": (1, (8, 8), dict(A=u(20, 19), B=u(19, 22), C=nan(20, 22)),
                      [("draw", {"color": "phase", "kinds": ("read",), "arrays": ["A", "B"],
                                 "note": "BM, BN, BK, TM, TN = 32, 32, 8, 4, 4: one block over a 20x22 C\ncolour = "
                                         "barrier phase: the block loads a 32x8 tile of A and an 8x32 tile of B per step"})]),
    }


def goal_kernel(name, tpb, tile):
    """The library's kernel for the exercise `name`, with the exercise's TPB and TILE (the ladder's at the
    sizes its check uses first)."""
    from course_lib.cuda import matmul, puzzles

    ladder = {"matmul_naive": lambda: matmul.k_matmul_naive, "matmul_tiled": lambda: matmul.tiled_kernel(tile),
              "matmul_1d": lambda: matmul.blocked_1d_kernel(16, 16, 4, 4),
              "matmul_2d": lambda: matmul.blocked_2d_kernel(32, 32, 8, 4, 4)}
    if name in ladder:
        return ladder[name]()
    return rebind(getattr(puzzles, "k_" + name), TPB=tpb, POOL_BUF=tpb + 2, CONV_BUF=tpb + puzzles.MAX_K - 1)


def reference(name, tpb=8, tile=8):
    """The course's own kernel for the chapter 07 exercise `name`, to run under the tracer, as the goal
    pictures do: `trace(reference("pool3"), 3, 8, a=a, out=out).draw()`. Its code is the exercise's
    answer; read it once your check passes."""
    return goal_kernel(name, tpb, tile)


def goal(name, tpb=8, tile=8):
    """Draw what the chapter 07 exercise `name` must do: which thread reads and writes which
    element. The picture traces the course's own kernel for it at the exercise's sizes, on fixed
    inputs; it never runs your kernel."""
    import matplotlib.pyplot as plt

    goals = _goals(tpb, tile)
    if name not in goals:
        raise KeyError(f"no goal picture for {name!r}; there are: {', '.join(goals)}")
    grid, block, arrays, pictures = goals[name]
    t = trace(goal_kernel(name, tpb, tile), grid, block, **arrays)
    for what, opts in pictures:
        if what == "steps":
            t.draw_steps(opts, title=f"the goal of {name}: {opts}, step by step\n"
                                     f"number = thread in block, n× = n threads")
        else:
            opts = dict(opts)
            note = opts.pop("note", "")
            legend = "colour = block" if opts.get("color", "block") == "block" else ""
            legend += ", number = " + ("(x,y) of the thread in its block" if opts.get("label") == "xy"
                                       else "thread in block") + ", n× = n threads"
            nd = _ndim(t.grid, t.block)
            t.draw(title=f"the goal of {name}: grid {tuple(t.grid)[:nd]}, block {tuple(t.block)[:nd]}"
                         f"{'; ' + note if note else ''}\n{legend.lstrip(', ')}", **opts)
    plt.show()
