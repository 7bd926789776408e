"""Chapter 13: a compiler for the course's tensor library. It captures a training step, fuses it,
generates Numba kernels for it and replays it.

    from course_lib.compiler import compile
    from course_lib.compiler.capturable import CAPTURABLE
    from course_lib.gpt.trainer import configure_optimizer, train_step

    optimizer = configure_optimizer(model, cfg, CAPTURABLE)
    step = compile(train_step)        # then call it as train_step: step(model, optimizer, x, y, 1.0, CAPTURABLE)

One idea per file, in the order a step goes through them:
    ir.py          the captured program: buffers, views, nodes, the places of state
    trace.py       capture: a tracing backend and an op mode record one eager call
    confirm.py     a capture is trusted once the next call's capture agrees with it
    guards.py      what a later call must match to replay it (shapes, dtypes, objects, values)
    fuse.py        which nodes share one loop: what a group is, and the grouping walk
    scalar.py      one element of each op, as generated code writes it (with a vectorizable exp)
    lower.py       a group described as a Kernel: its loads, its steps, what it stores
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

The four pieces chapter 13's exercises write (the recording of one call, the fusion rule, the loop of a
pointwise group, the guard check) are `Pieces`; the course's own are listed in course_lib/answer_key.py.
"""

from course_lib.compiler.step import CompiledStep, Pieces, compile  # noqa: F401
