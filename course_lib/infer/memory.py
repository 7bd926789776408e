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


# ---- buffers from the plan ---------------------------------------------------------------------
# The session turns the plan into memory. Its first run with new input shapes records the size of
# every intermediate; from the second run on, each node whose kernel can write into a buffer it is
# given (a keyword `out`) gets one of a few buffers allocated once, shared by values whose lives do
# not overlap. onnxruntime does the same ("memory patterns", recorded per input shape).

def buffer_lives(order, views, keep):
    """value name -> index of the last node that may read it, directly or through a view.

    views[k] says whether node k returned a view of one of its inputs on the first run (Reshape,
    Transpose, Slice...): then its inputs live as long as its outputs. Values that reach a graph
    output (`keep`) live forever: the caller holds them after the run."""
    forever = len(order)
    end = {name: forever for name in keep}
    for k, node in enumerate(order):
        for i in node.inputs:
            if i:
                end[i] = max(end.get(i, k), k)
    for k in range(len(order) - 1, -1, -1):
        node = order[k]
        if views[k]:
            outs = [end.get(o, k) for o in node.outputs if o]
            for i in node.inputs:
                if i and outs:
                    end[i] = max(end.get(i, k), *outs)
    return end


def assign_buffers(order, writes_into_out, sizes, views, keep):
    """{node index: buffer index} and the buffers' (nbytes, dtype): the output of each node that can
    write into a given buffer gets a buffer whose previous value is dead; a value that may reach a
    graph output is never planned (the caller keeps it), nor one the first run did not measure."""
    end = buffer_lives(order, views, keep)
    buffers, free, assigned, busy = [], {}, {}, []   # busy: (end, buffer) of the buffers in use
    for k, node in enumerate(order):
        for stop, b in [item for item in busy if item[0] < k]:   # dead before this node reads anything
            busy.remove((stop, b))
            free.setdefault(buffers[b], []).append(b)
        out = node.outputs[0] if node.outputs else ""
        if not writes_into_out[k] or not out or out not in sizes or end.get(out, k) >= len(order):
            continue
        spec = sizes[out]                                              # (nbytes, dtype)
        b = free[spec].pop() if free.get(spec) else len(buffers)
        if b == len(buffers):
            buffers.append(spec)
        assigned[k] = b
        busy.append((end.get(out, k), b))
    return assigned, buffers
