"""The memory plan: free each intermediate buffer right after the last node that reads it.

The naive plan keeps every intermediate alive until the end; its peak is the sum of all of them.
The planned peak is the largest total of the buffers alive at once, walking the schedule.
"""

from dataclasses import dataclass

from .schedule import last_uses


@dataclass
class MemoryPlan:
    naive_bytes: int       # every intermediate kept to the end
    peak_bytes: int        # freeing after the last use
    live_bytes: list       # bytes alive after each node, in schedule order
    naive_live_bytes: list  # the same without ever freeing
    last_use: dict         # value name -> index of the node after which it is freed

    def __str__(self):
        return (f"peak {self.peak_bytes / 1e6:.3f} MB with the plan, {self.naive_bytes / 1e6:.3f} MB naive "
                f"({self.naive_bytes / max(self.peak_bytes, 1):.1f}x less)")


def memory_plan(session, feeds):
    """Run once, record every intermediate's size, and replay the schedule with and without frees."""
    sizes = {}
    session.run(None, feeds, on_node=lambda node, dt, outs: sizes.update(
        {n: v.nbytes for n, v in zip([o for o in node.outputs if o], outs)}))
    keep = {v.name for v in session.graph.outputs}
    last = last_uses(session.order, keep)
    live, alive, timeline, naive, total = 0, {}, [], [], 0
    for k, node in enumerate(session.order):
        for out in node.outputs:
            if out in sizes:
                alive[out] = sizes[out]
                live += sizes[out]
                total += sizes[out]
        timeline.append(live)
        naive.append(total)
        for name in [n for n, at in last.items() if at == k and n in alive]:
            live -= alive.pop(name)
    return MemoryPlan(sum(sizes.values()), max(timeline, default=0), timeline, naive, last)
