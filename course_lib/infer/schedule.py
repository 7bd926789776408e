"""Scheduling: an order of nodes in which every node runs after the nodes it reads from."""

import heapq

from .validate import InvalidGraph


def topological_order(graph):
    """Kahn's algorithm: repeatedly run a node whose inputs are all available. Ties keep file order."""
    ready_values = {v.name for v in graph.inputs} | set(graph.initializers) | {""}
    waiting = {id(n): sum(1 for i in set(n.inputs) if i not in ready_values) for n in graph.nodes}
    producers = graph.producers()
    readers = {}
    for n in graph.nodes:
        for i in set(n.inputs):
            if i not in ready_values and i in producers:
                readers.setdefault(i, []).append(n)
    index = {id(n): k for k, n in enumerate(graph.nodes)}
    ready = [index[id(n)] for n in graph.nodes if waiting[id(n)] == 0]  # a heap of file positions
    order = []
    while ready:
        node = graph.nodes[heapq.heappop(ready)]
        order.append(node)
        for out in node.outputs:
            for reader in readers.get(out, []):
                waiting[id(reader)] -= 1
                if waiting[id(reader)] == 0:
                    heapq.heappush(ready, index[id(reader)])
    if len(order) != len(graph.nodes):
        stuck = [n.name or n.op_type for n in graph.nodes if waiting[id(n)] > 0]
        raise InvalidGraph(f"malformed graph: a cycle, or values nobody writes, blocks nodes {stuck[:5]}")
    return order


def last_uses(order, keep):
    """value name -> index of the last node that reads it; values in `keep` (graph outputs) never die."""
    last = {}
    for k, node in enumerate(order):
        for i in node.inputs:
            if i and i not in keep:
                last[i] = k
    return last
