"""Continuous batching: the scheduler decides, before every step, which sequences run in it.

Static batching keeps a batch together until its longest request is done, and a slot whose request
finished early idles until then. Orca's iteration-level scheduling decides again at every step:

1. retire the sequences that finished at the last step, so their blocks are free at once;
2. give every running sequence (oldest first) a slot for its newest token; when the cache is full,
   preempt the newest running sequence: free its blocks and put it at the head of the queue, to be
   recomputed from its tokens (prompt and output so far) when it comes back; nothing it generated is lost;
3. if nobody was preempted, admit waiting sequences, first come first served, while their blocks fit
   and the step's token budget lasts.

The batch mixes prefills (a new sequence's prompt, less its cached prefix) and decodes (one token each).
"""


def schedule(waiting, running, blocks, max_tokens):
    """The course's answer to exercise 14.3 (`schedule`): read it once your check passes.

    waiting: a deque of Sequences, running: a list in admission order, blocks: a BlockManager, max_tokens:
    the most tokens one step computes. Updates all three and returns this step's sequences."""
    for seq in [s for s in running if s.finished]:
        blocks.free(seq.id)
        running.remove(seq)
    batch, preempted = [], False
    for seq in list(running):
        if seq not in running:                         # preempted by an older sequence just now
            continue
        while not blocks.append(seq.id, seq.tokens[-1]):
            newest = running.pop()
            blocks.free(newest.id)
            newest.computed = 0
            waiting.appendleft(newest)
            preempted = True
            if newest is seq:
                break
        else:
            batch.append(seq)
    budget = max_tokens - len(batch)
    while waiting and not preempted and len(waiting[0].tokens) <= budget:
        seq = waiting[0]
        cached = blocks.allocate(seq.id, seq.tokens)
        if cached is None:
            break
        waiting.popleft()
        seq.computed = cached
        running.append(seq)
        batch.append(seq)
        budget -= len(seq.tokens) - cached
    return batch
