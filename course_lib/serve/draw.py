"""Pictures of serving: the batch slots step by step, and a block table over the cache.

    slots(ax, timeline)                       # timeline: per step, [(sequence id, tokens, "prefill"/"decode")]
    cache(ax, tables, num_blocks, block_size, lengths)

A slot picture has one row per batch slot and one column per step: a cell is coloured by the sequence in
that slot (hatched while it reads its prompt), white when the slot idles.
"""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

COLORS = plt.get_cmap("tab10").colors


def slots(ax, timeline, n_slots=None, title=None):
    """The batch slots, step by step. A sequence keeps its slot while it runs (the lowest free one)."""
    where, busy = {}, []
    for step in timeline:
        running = {sid for sid, _, _ in step}
        for sid in list(where):
            if sid not in running:
                del where[sid]
        for sid, _, _ in step:
            if sid not in where:
                taken = set(where.values())
                where[sid] = next(i for i in range(len(taken) + 1) if i not in taken)
        busy.append([(where[sid], sid, kind) for sid, _, kind in step])
    n_slots = n_slots or max((s for step in busy for s, _, _ in step), default=0) + 1
    for t, step in enumerate(busy):
        for slot, sid, kind in step:
            ax.add_patch(Rectangle((t, slot), 1, 1, facecolor=COLORS[sid % len(COLORS)], edgecolor="white",
                                   linewidth=0.3, hatch="///" if kind == "prefill" else None))
    ax.set(xlim=(0, max(len(timeline), 1)), ylim=(n_slots, 0), xlabel="step", ylabel="batch slot")
    if title:
        ax.set_title(title, fontsize=9)
    idle = sum(n_slots - len(step) for step in busy)
    return idle / max(n_slots * len(busy), 1)


def cache(ax, tables, num_blocks, block_size, lengths):
    """The cache as num_blocks rows of block_size cells; each sequence's blocks in its colour, with the
    position of each block's first cell written on it, and the empty tail of a last block left pale."""
    grid = np.ones((num_blocks, block_size, 3))
    for sid, table in tables.items():
        color = np.array(COLORS[sid % len(COLORS)])
        for i, block in enumerate(table):
            used = min(block_size, lengths[sid] - i * block_size)
            grid[block, :used] = color
            grid[block, used:] = 0.8 + 0.2 * color
            ax.text(block_size - 0.35, block, f"seq {sid}, its block {i}", ha="left", va="center", fontsize=7)
    ax.imshow(grid, aspect="auto", extent=(-0.5, block_size - 0.5, num_blocks - 0.5, -0.5))
    ax.set(xticks=range(block_size), yticks=range(num_blocks), xlabel="offset in the block", ylabel="block of the cache")
    ax.tick_params(labelsize=7)
