"""Speculative sampling's acceptance rule (Leviathan et al. 2023; Chen et al. 2023).

A small draft model proposes k tokens, sampled from its distributions q_0 .. q_(k-1); the target model
scores all of them in one call, which gives its distributions p_0 .. p_k at the same positions and one
more. Draft token x_i is kept with probability min(1, p_i(x_i) / q_i(x_i)). At the first rejection the
position is sampled again from the leftover of p over q, (p_i - q_i)+ normalized, and the rest of the
draft is dropped; if all k are kept, one more token comes from p_k. Each emitted token then follows the
target's distribution exactly, whatever the draft: the draft only changes how many come per target call.
With greedy decoding p and q put all their mass on one token, and the rule keeps a drafted token exactly
when it is the target's argmax.
"""

import numpy as np


def accept(p, q, drafted, rng):
    """The course's answer to exercise 14.4 (`speculative_accept`): read it once your check passes.

    p (k + 1, V) the target's probabilities, q (k, V) the draft's, drafted (k,) the draft's tokens, rng a
    numpy Generator. Returns the emitted tokens: the kept drafts, then one corrected or extra token."""
    out = []
    for i, x in enumerate(drafted):
        if rng.random() * q[i, x] < p[i, x]:            # u < p/q, without dividing by q
            out.append(int(x))
            continue
        leftover = np.maximum(p[i] - q[i], 0.0)
        out.append(int(rng.choice(len(leftover), p=leftover / leftover.sum())))
        return out
    out.append(int(rng.choice(p.shape[1], p=p[-1] / p[-1].sum())))
    return out
