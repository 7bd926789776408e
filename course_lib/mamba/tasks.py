"""Selective copying, the toy task that shows why Mamba's parameters depend on the input.

A sequence of `length` positions holds `n_marked` data tokens at random places among filler tokens;
then come `n_marked` recall tokens, and at those last positions the model must output the data tokens
in their order. The places change from sequence to sequence, so a fixed (time-invariant) filter
cannot pick them out: the model has to look at each token to decide whether to keep it.

    FILLER, RECALL = 0, 1          data tokens are 2 .. 2 + n_values - 1
    x:  7 0 0 5 0 0 0 0 9 0 ... 0 1 1 1
    y:  - - - - - - - - - - ... - 7 5 9      (- is IGNORE: no loss there)
"""

import torch

FILLER, RECALL, IGNORE = 0, 1, -100   # IGNORE is cross_entropy's default ignore_index


def selective_copy_batch(batch, length=32, n_marked=4, n_values=8, generator=None):
    """(x, y), both (batch, length + n_marked) int64. The vocabulary has n_values + 2 tokens."""
    values = torch.randint(2, 2 + n_values, (batch, n_marked), generator=generator)
    places = torch.rand(batch, length, generator=generator).argsort(dim=1)[:, :n_marked].sort(dim=1).values
    x = torch.full((batch, length + n_marked), FILLER)
    x.scatter_(1, places, values)
    x[:, length:] = RECALL
    y = torch.full_like(x, IGNORE)
    y[:, length:] = values
    return x, y
