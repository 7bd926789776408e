"""Fusion: put the nodes that can share one loop into groups; each group becomes one kernel.

An eager step runs every op as its own pass over memory: GELU's seven ops read and write a (768, 512)
tensor seven times, softmax's five ops five times. One loop that keeps the in-between values in
registers reads the inputs once and writes what the rest of the step needs once.

A group is one loop over the rows of one shape (`group.rows`: (rows, n), the number of rows of its last
dim and their length, as `rows_of` reads a shape), at the place of its first node (`group.first`). Inside
the loop, the element (r, j) of each node is computed from its operands' elements, so a grouping is right
only if the loop can compute every member that way:

- the members are elementwise ops, or reductions over the last dim (a row folds its own values); products
  stay with BLAS, and copies into views, islands and fills stay alone (`fusable`);
- each member has the loop's rows, or one value per row in a group that reduces (the row's max, its sum);
- a value made inside the group is read at the element the loop is making (`read_kind` says how a view
  is read); any other view of it needs values that another row makes, or that are not made yet;
- a value made outside the group exists when the group runs: it was made by a group that starts earlier.

Which node may join which group is the fusion rule, `rule(group, node)` (Pieces.can_join, chapter 13's
second exercise). `group_nodes` walks the nodes in order and offers each to the group of its latest
producer; when a node reads values of two groups (m = b1 * m + (1 - b1) * g reads both products), it
then tries to merge them into one, member by member, with the same rule.
"""

from __future__ import annotations

import math

from course_lib.compiler.ir import TEMP
from course_lib.tensor.tensor_data import contiguous_strides

ELEMENTWISE = ("map", "zip", "where", "one_hot")

# how a loop over (rows, n), the element (r, j), reads an operand
FULL, ROW, COL, ONE, GENERAL = "full", "row", "col", "one", "general"


def broadcast_strides(view, shape):
    """The view's strides aligned to `shape` (numpy's broadcasting): 0 for new and size-1 dims."""
    extra = len(shape) - len(view.shape)
    strides = [0] * extra + [0 if n == 1 and m != 1 else s for n, m, s in zip(view.shape, shape[extra:], view.strides)]
    return tuple(strides)


def read_kind(ref, shape):
    """How a loop over `shape` (rows of its last dim) reads `ref`: FULL (element r*n + j), ROW (j: one row
    for all rows), COL (r: one value per row), ONE (one value), or GENERAL (any other strides)."""
    strides = broadcast_strides(ref.view, shape)
    natural = contiguous_strides(shape)
    if all(s == e for s, e, n in zip(strides, natural, shape) if n != 1):
        return FULL
    if all(s == 0 for s, n in zip(strides, shape) if n != 1):
        return ONE
    if shape and (shape[-1] == 1 or strides[-1] == 1) and all(s == 0 for s, n in zip(strides[:-1], shape[:-1]) if n != 1):
        return ROW
    rows = contiguous_strides(shape[:-1])
    if shape and (shape[-1] == 1 or strides[-1] == 0) and \
            all(s == e for s, e, n in zip(strides[:-1], rows, shape[:-1]) if n != 1):
        return COL
    return GENERAL


def row_shape(shape):
    """The shape of one value per row: the last dim becomes 1."""
    return tuple(shape[:-1]) + (1,)


def rows_of(shape):
    """A loop's (rows, n): how many rows of the last dim, and its length. (768, 512) and (12, 64, 512) have
    the same rows: a reshape that keeps the last dim keeps every element in its place (a Linear layer
    works on (rows, in) and hands back (B, T, out))."""
    shape = tuple(shape)
    return (math.prod(shape[:-1]), shape[-1]) if shape else (1, 1)


def fusable(node):
    """A node that can be one step of a loop: elementwise, or a reduction (over the last dim, see the rule)."""
    return (node.kind in ELEMENTWISE and not node.attrs.get("into")) or node.kind == "reduce"


class Group:
    """Nodes that run as one kernel, in order. `shape` is the loop's shape; `reduces` once a reduction joined."""

    def __init__(self, node):
        self.nodes = [node]
        self.members = {node.id}
        self.first = node.start = node.id
        self.fusable = fusable(node)
        if node.kind == "reduce" and self.fusable:
            self.shape = tuple(node.inputs[0].shape)
            self.reduces = node.attrs["dim"] == len(self.shape) - 1
            self.fusable = self.reduces   # a reduction over another dim runs alone
        else:
            self.shape = tuple(node.shape)
            self.reduces = False
        self.rows = rows_of(self.shape)

    def add(self, node):
        self.nodes.append(node)
        self.members.add(node.id)
        node.start = self.first
        if node.kind == "reduce":
            self.reduces = True

    def __contains__(self, node):
        return node is not None and node.id in self.members

    @property
    def size(self):
        return math.prod(self.shape)

    def __repr__(self):
        return f"<group of {len(self.nodes)} over {self.shape}: {', '.join(n.label() for n in self.nodes)}>"


def group_nodes(nodes, rule):
    """Groups of the nodes (in the order they ran), in the order of their first nodes. Each node is offered
    to the groups of the nodes that made its inputs, the latest first, and starts a group of its own if
    none takes it; then the groups of its other inputs are merged into its own where the rule allows."""
    groups, group_of = [], {}
    for node in nodes:
        node.start = -1
        producers = {ref.buffer.producer.id: ref.buffer.producer for ref in node.inputs
                     if ref.buffer.kind == TEMP and ref.buffer.producer is not None and ref.buffer.producer.id in group_of}
        candidates = list(dict.fromkeys(group_of[i] for i in sorted(producers, reverse=True)))
        target = None
        if fusable(node):
            target = next((g for g in candidates if rule(g, node)), None)
        if target is None:
            target = Group(node)
            groups.append(target)
        else:
            target.add(node)
        group_of[node.id] = target
        for other in candidates:
            if other is not target and other in groups and other.fusable and target.fusable:
                merged = _merge(other, target, rule)
                if merged is not None:
                    dropped = target if merged is other else other
                    groups.remove(dropped)
                    for n in merged.nodes:
                        group_of[n.id] = merged
                    target = merged
    return groups


def _merge(a, b, rule):
    """The two groups as one (the earlier one, grown by the later one's nodes), or None if the rule refuses."""
    early, late = (a, b) if a.first < b.first else (b, a)
    trial = Group(early.nodes[0])
    for n in early.nodes[1:]:
        trial.add(n)
    trial.shape, trial.rows, trial.reduces = early.shape, early.rows, early.reduces
    for n in late.nodes:
        if not rule(trial, n):
            for m in early.nodes:
                m.start = early.first
            for m in late.nodes:
                m.start = late.first
            return None
        trial.add(n)
    early.nodes = sorted(trial.nodes, key=lambda n: n.id)
    early.members, early.reduces = set(trial.members), trial.reduces
    return early
