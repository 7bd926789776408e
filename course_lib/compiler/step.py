"""A compiled step: capture, confirm, build, then replay every call that passes the guards.

    step = compile(train_step)            # train_step(model, optimizer, x, y, ...) -> the loss tensor
    for x, y in batches:
        loss = step(model, optimizer, x, y)

The first calls run eagerly, recorded (trace.py), until two captures in a row agree (confirm.py); then
the program is built (replay.py) and every later call with the same shapes, dtypes and objects replays
it. What the compiler cannot do, it says in one line and leaves to eager execution:

- a value read by Python mid-step (`.item()`, `if loss < x`): the step runs eagerly from then on, and the
  line is named (a graph break);
- a number made outside the ops that changes between calls: the step runs eagerly, the line is named;
- an op that works outside the backend (it reads values with numpy): it runs as Python inside the
  compiled step (an island), and the line says which;
- a call that fails the guards (another shape): the step is captured again, and the line says why.
A generated kernel that fails raises KernelError with its source and its group.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from course_lib.compiler import answers, build, guards, kernels, trace
from course_lib.compiler.confirm import changed_constants, describe_change, signature
from course_lib.compiler.trace import describe_where


@dataclass
class Pieces:
    """The four pieces a learner writes, the course's by default: the tracer's recording of one backend
    call, the fusion rule, the generator of one pointwise group's loop, and the guard check."""
    record: object = answers.record
    can_join: object = answers.can_join
    pointwise: object = answers.pointwise_source
    guard: object = answers.guard


@dataclass
class Stats:
    captures: int = 0
    replays: int = 0
    eager: int = 0
    compile_seconds: float = 0.0
    kernels: dict = field(default_factory=dict)   # compiled / loaded / reused, for the programs built here


class CompiledStep:
    """Calls fn through captures and replays (see the module's docstring)."""

    MAX_CAPTURES = 4   # captures of one signature of the arguments before giving up on it

    def __init__(self, fn, pieces=None, verbose=True, threads=None):
        import numba

        self.fn, self.pieces, self.verbose = fn, pieces or Pieces(), verbose
        self.threads = numba.config.NUMBA_NUM_THREADS if threads is None else threads
        self.name = getattr(fn, "__name__", "step")
        self.programs = []           # (expected arguments, Program)
        self.pending = None          # (expected arguments, Graph, how many captures) not yet confirmed
        self.eager_reason = None     # set once the step runs eagerly for good
        self.stats = Stats()
        self.said = set()

    def say(self, line):
        if self.verbose and line not in self.said:
            self.said.add(line)
            print(f"compile: {line}")

    @property
    def program(self):
        """The latest program built (None before the step is compiled)."""
        return self.programs[-1][1] if self.programs else None

    def __call__(self, *args):
        if self.eager_reason is not None:
            self.stats.eager += 1
            return self.fn(*args)
        reason = None
        for expected, program in self.programs:
            reason = self.pieces.guard(expected, args)
            if reason is None:
                self.stats.replays += 1
                return program.run(args)
        if reason is not None and (self.pending is None or self.pieces.guard(self.pending[0], args) is not None):
            self.say(f"capturing `{self.name}` again: {reason}")
        return self.capture(args)

    def capture(self, args):
        expected = guards.describe(args)
        start = time.perf_counter()
        graph, result = trace.capture(self.fn, args, self.pieces.record)
        self.stats.captures += 1
        if graph.breaks:
            where, what = graph.breaks[0]
            return self.give_up(f"graph break: {describe_where(where)} {what}, so the Python after it depends "
                                "on the data; compute it with tensor ops, or call it outside the compiled step", result)
        for node in graph.nodes:
            if node.kind == "island":
                self.say(f"{node.scope} works outside the backend "
                         f"({describe_where(node.where)}): it runs as Python inside the compiled step")
        previous = self.pending
        if previous is None or self.pieces.guard(previous[0], args) is not None:
            self.pending = (expected, graph, 1)
            return result
        count = previous[2] + 1
        if signature(previous[1]) != signature(graph):
            if count >= self.MAX_CAPTURES:
                return self.give_up(f"{count} captures in a row did different things; the step stays eager", result)
            self.pending = (expected, graph, count)
            return result
        changed = changed_constants(previous[1], graph)
        if changed:
            where, old, new = changed[0]
            return self.give_up(f"{describe_where(where)} uses {describe_change(old, new)}; a replay would repeat "
                                "the first, so compute it from tensors the step reads (or pass it in as a tensor)",
                                result)
        before = dict(kernels.STATS)
        program = build.build(graph, self.pieces.can_join, self.pieces.pointwise, threads=self.threads)
        for key, value in kernels.STATS.items():
            self.stats.kernels[key] = self.stats.kernels.get(key, 0) + value - before[key]
        self.stats.compile_seconds += time.perf_counter() - start
        self.programs.append((expected, program))
        self.pending = None
        return result

    def give_up(self, why, result):
        self.say(f"`{self.name}` runs eagerly: {why}")
        self.eager_reason = why
        self.pending = None
        return result


def compile(fn=None, *, pieces=None, verbose=True, threads=None):
    """Compile a step: `compile(train_step)`, or as a decorator `@compile`."""
    if fn is None:
        return lambda f: CompiledStep(f, pieces, verbose, threads)
    return CompiledStep(fn, pieces, verbose, threads)
