"""The order every walk of a graph uses: each node after all of its inputs.

The course's answer to exercise 03.1: read it once your check passes.
"""


def topological_order(outputs):
    """The course's answer to exercise 03.1 (`topological_order`): read it once your check passes.

    Every node the outputs depend on, each after its inputs. An explicit stack, no recursion: a node
    goes on the stack once to have its inputs visited, and again beneath them, to be listed when they
    are done."""
    order, seen = [], set()
    for out in outputs:
        stack = [(out, False)]
        while stack:
            node, inputs_done = stack.pop()
            if inputs_done:
                order.append(node)
            elif node not in seen:
                seen.add(node)
                stack.append((node, True))
                stack.extend((i, False) for i in reversed(node.inputs) if i not in seen)
    return order
