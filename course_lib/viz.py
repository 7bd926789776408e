"""Pictures: computation graphs with graphviz, training curves with matplotlib.

`draw_graph` is the one graph drawer of the course. Every chapter turns its own graph
(scalar Values, tensors, static graphs, ONNX models) into plain nodes and edges and
hands them here, so all graphs look alike.
"""

import shutil
import sys

INSTALL_DOT = {
    "Debian/Ubuntu": "sudo apt-get install graphviz",
    "macOS (Homebrew)": "brew install graphviz",
    "conda": "conda install -c conda-forge graphviz",
}

# Node fill colours by kind; chapters may pass any other graphviz colour too.
COLORS = {"input": "#dbeafe", "param": "#fde68a", "op": "#e5e7eb", "const": "#f3f4f6",
          "output": "#bbf7d0", "grad": "#fecaca", "value": "#ffffff"}


class DotNotFound(RuntimeError):
    """The Graphviz `dot` executable is not installed."""


def require_dot():
    """Raise DotNotFound, with the install command for each platform, if `dot` is missing."""
    if shutil.which("dot") is None:
        how = "\n".join(f"  {where:18s} {cmd}" for where, cmd in INSTALL_DOT.items())
        raise DotNotFound(
            "Drawing graphs needs the Graphviz `dot` program, which is not on your PATH.\n"
            f"Install it with one of:\n{how}\nthen restart the kernel. (`make lab` does this for you "
            "on Debian/Ubuntu when run as root.)")


def draw_graph(nodes, edges, rankdir="LR", title=None):
    """Draw a directed graph and return a graphviz.Digraph (Jupyter shows it as SVG).

    nodes: iterable of dicts with "id" and "label", and optionally "kind" (a key of COLORS),
           "shape" ("box", "ellipse", "record", ...) and "color".
    edges: iterable of (src_id, dst_id) or (src_id, dst_id, label).
    """
    import graphviz

    require_dot()
    g = graphviz.Digraph(graph_attr={"rankdir": rankdir, "fontname": "Helvetica"},
                         node_attr={"fontname": "Helvetica", "fontsize": "11", "style": "filled"},
                         edge_attr={"fontname": "Helvetica", "fontsize": "9"})
    if title:
        g.attr(label=title, labelloc="t", fontsize="13")
    for n in nodes:
        kind = n.get("kind", "value")
        g.node(str(n["id"]), str(n["label"]), shape=n.get("shape", "ellipse" if kind == "op" else "box"),
               fillcolor=n.get("color", COLORS.get(kind, "#ffffff")))
    for e in edges:
        src, dst, *label = e
        g.edge(str(src), str(dst), label=str(label[0]) if label else "")
    return g


def plot_curves(curves, xlabel="step", ylabel="loss", logy=False, title=None, ax=None):
    """Plot named series, e.g. {"train": [...], "val": [...]}, on one axis and return the axis.

    A series is a list of y values, or a pair (xs, ys) when points are not one per step.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    for name, series in curves.items():
        if isinstance(series, tuple) and len(series) == 2:
            ax.plot(series[0], series[1], label=name)
        else:
            ax.plot(range(len(series)), series, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    if title:
        ax.set_title(title)
    if len(curves) > 1:
        ax.legend()
    ax.grid(alpha=0.3)
    return ax


if __name__ == "__main__":  # `python -m course_lib.viz` checks the install
    require_dot()
    print("dot found:", shutil.which("dot"), file=sys.stderr)
