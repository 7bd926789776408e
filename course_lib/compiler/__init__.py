"""Chapter 13: a compiler for the course's tensor library. It captures a training step, fuses it,
generates Numba kernels for it and replays it.

    from course_lib.compiler import compile
    step = compile(train_step)        # then call step(model, optimizer, x, y) as train_step

One idea per file, in the order a step goes through them:
    ir.py          the captured program: buffers, views, nodes, the places of state
    trace.py       capture: a tracing backend and an op mode record one eager call
    confirm.py     a capture is trusted once the next call's capture agrees with it
    guards.py      may a later call replay it (shapes, dtypes, objects, values)?
    fuse.py        which nodes share one loop: the fusion rule and the grouping
    scalar.py      one element of each op, as generated code writes it (with a vectorizable exp)
    codegen.py     the source of one kernel per group
    kernels.py     compiling the sources with Numba, cached by their text, in memory and on disk
    plan.py        the memory plan: every value a fixed place in one arena
    launches.py    what each group becomes (a kernel, a BLAS product, a numpy call, an island), bound
    build.py       from a captured graph to the program: groups, launches, places, the replay's source
    replay.py      the program: one generated function that makes the step's calls in order
    index.py       the embedding's gather and scatter-add as kernels
    step.py        the compiled step: capture, confirm, build, replay, and the messages
    capturable.py  CAPTURABLE: the course's library (a trainer.Library) whose changing numbers live in tensors
    draw.py        the graph before and after fusion, as chapter 03 draws graphs
"""

from course_lib.compiler.step import CompiledStep, Pieces, compile  # noqa: F401
