"""Speculative decoding of one sequence: the draft proposes k tokens, the target checks them in one call.

    tokens, stats = speculative_generate(target, draft, prompt, max_tokens=64, k=4, accept=accept)
    stats["target_calls"] / max_tokens        # target calls per generated token: below 1 when drafts pass

target and draft are PagedGPTs (serve/model.py), each with a cache long enough for the sequence; the
sequence's positions sit in blocks 0, 1, 2, ... in order. `accept(p, q, drafted, rng)` is the acceptance
rule (exercise 4): it returns the tokens to emit, the kept drafts then one more.

Each model keeps the keys and values of the tokens it has computed. After a round, the target's are
right up to the last kept draft: the rest were computed for rejected tokens and are simply overwritten
next round (a cache position is rewritten whenever its token is computed again). The draft never
computed its own last proposal, so it catches up by one token at the start of the next round.
"""

import numpy as np

from course_lib.serve.engine import softmax


def _probs(logits, temperature):
    """Each row's distribution; with temperature 0, all the mass on the argmax (greedy as a distribution)."""
    if temperature == 0:
        p = np.zeros(logits.shape)
        p[np.arange(len(logits)), logits.argmax(-1)] = 1.0
        return p
    return np.stack([softmax(row, temperature) for row in logits])


class Contiguous:
    """One sequence in a PagedGPT's cache, its positions in blocks 0, 1, 2, ... in order."""

    def __init__(self, model):
        self.model = model
        self.table = np.arange(model.num_blocks, dtype=np.int32)[None, :]

    def __call__(self, tokens, start):
        """Logits of every one of `tokens`, which sit at positions start, start + 1, ..."""
        n = len(tokens)
        pos = np.arange(start, start + n)
        return self.model.forward(np.asarray(tokens), pos, pos, np.repeat(self.table, n, 0), pos + 1, np.arange(n))


def speculative_generate(target, draft, prompt, max_tokens, k, accept, temperature=0.0, seed=0):
    """max_tokens new tokens after `prompt`, and {"target_calls", "draft_calls", "accepted", "drafted"}."""
    rng = np.random.default_rng(seed)
    run_target, run_draft = Contiguous(target), Contiguous(draft)
    tokens = list(prompt)
    t_done = d_done = 0                               # positions whose keys and values each model holds
    stats = {"target_calls": 0, "draft_calls": 0, "accepted": 0, "drafted": 0}
    goal = len(prompt) + max_tokens
    while len(tokens) < goal:
        n = len(tokens)
        kk = min(k, goal - n - 1)                      # no draft past the last token we need
        drafted, q = [], []
        for _ in range(kk):
            seen = tokens + drafted
            logits = run_draft(seen[d_done:], d_done)[-1:]
            d_done = len(seen)
            q.append(_probs(logits, temperature)[0])
            drafted.append(int(rng.choice(len(q[-1]), p=q[-1])) if temperature else int(np.argmax(q[-1])))
        stats["draft_calls"] += kk
        logits = run_target((tokens + drafted)[t_done:], t_done)[-(kk + 1):]   # p_0 .. p_kk
        stats["target_calls"] += 1
        q = np.array(q) if q else np.zeros((0, logits.shape[1]))
        emitted = accept(_probs(logits, temperature), q, np.array(drafted, dtype=np.int64), rng)
        kept = len(emitted) - 1
        stats["accepted"] += kept
        stats["drafted"] += kk
        tokens += emitted
        t_done = n + kept                              # the target's cache is right up to the last kept draft
        d_done = min(d_done, n + kept)
    return tokens[len(prompt):goal], stats


def plain_generate(model, prompt, max_tokens, temperature=0.0, seed=0):
    """The same model alone, one call per token (the baseline): max_tokens new tokens after `prompt`."""
    rng = np.random.default_rng(seed)
    run = Contiguous(model)
    tokens, done = list(prompt), 0
    for _ in range(max_tokens):
        p = _probs(run(tokens[done:], done)[-1:], temperature)[0]
        done = len(tokens)
        tokens.append(int(rng.choice(len(p), p=p)) if temperature else int(np.argmax(p)))
    return tokens[len(prompt):]
