"""A per-op profiler: time every node over a few runs, then sum by op type."""

import time


def profile(session, feeds, repeats=5):
    """Rows (op_type, calls per run, milliseconds per run, share of the total), slowest first."""
    totals, calls = {}, {}

    def on_node(node, seconds, outs):
        key = node.op_type
        totals[key] = totals.get(key, 0.0) + seconds
        calls[key] = calls.get(key, 0) + 1

    session.run(None, feeds)  # warm up
    t0 = time.perf_counter()
    for _ in range(repeats):
        session.run(None, feeds, on_node=on_node)
    wall = (time.perf_counter() - t0) / repeats
    everything = sum(totals.values())
    rows = [(op, calls[op] // repeats, 1e3 * t / repeats, t / everything) for op, t in totals.items()]
    rows.sort(key=lambda r: -r[2])
    return rows, 1e3 * wall


def format_table(rows):
    lines = [f"{'op':<18}{'calls':>6}{'ms/run':>10}{'share':>8}"]
    lines += [f"{op:<18}{n:>6}{ms:>10.3f}{share:>8.1%}" for op, n, ms, share in rows]
    return "\n".join(lines)


def plot_profile(rows, ax=None, title="time per op type"):
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 0.3 * len(rows) + 1))
    ops = [r[0] for r in rows][::-1]
    ax.barh(ops, [r[2] for r in rows][::-1], color="#60a5fa")
    ax.set_xlabel("milliseconds per run")
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="x")
    return ax
