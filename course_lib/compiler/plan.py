"""The memory plan: every value of the step gets a fixed place in one arena, so a replay allocates nothing.

Chapter 09's plan frees a value after the last node that reads it (`infer.schedule.last_uses`) and adds
up the bytes alive at each moment. A replayed step goes one further: it knows every value's size and
lifetime before it runs, so it can hand out the addresses once. Two values whose lifetimes do not
overlap may share memory; `place` packs them, the largest first, each at the lowest address free for
its whole lifetime (first fit, as a C compiler packs a function's stack frame).

The peak of the plan is the arena's size; the naive plan, one buffer per value as the eager step's
fresh arrays, is the sum of all sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.infer.schedule import last_uses

ALIGN = 16  # elements: every value starts on a 64-byte line (SIMD loads and stores stay aligned)


@dataclass
class Placement:
    """Where each value lives: {key: offset} in an arena of `size` elements (one arena per dtype)."""
    offsets: dict
    size: int
    naive: int


def lifetimes(steps, keep=()):
    """{value: (first step that writes it, last step that reads it)} for steps with .inputs and .outputs
    (value names); the values in `keep` live to the end. Built on chapter 09's last_uses."""
    last = last_uses(steps, set(keep))
    first = {}
    for k, step in enumerate(steps):
        for out in step.outputs:
            first.setdefault(out, k)
    end = len(steps)
    return {v: (k, end if v in keep else max(last.get(v, k), k)) for v, k in first.items()}


def _round(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def place(sizes, spans):
    """Offsets for values of `sizes` {key: elements} alive during `spans` {key: (first, last)}, both ends
    included: the largest first, each at the lowest offset that no value alive at the same time uses."""
    placed = []                            # (offset, end, first, last)
    offsets = {}
    for key in sorted(sizes, key=lambda k: (-sizes[k], spans[k][0], str(k))):
        size, (first, last) = _round(sizes[key]), spans[key]
        busy = sorted((o, e) for o, e, f, ll in placed if f <= last and first <= ll)
        offset = 0
        for o, e in busy:
            if offset + size <= o:
                break
            offset = max(offset, e)
        offsets[key] = offset
        placed.append((offset, offset + size, first, last))
    total = max((e for _, e, _, _ in placed), default=0)
    return Placement(offsets, total, sum(_round(s) for s in sizes.values()))
