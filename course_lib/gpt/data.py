"""Batches of (input, target) windows cut at random from a 1-D tensor of token ids.

    get_batch = make_get_batch(tokens, block_size=64, batch_size=12)
    x, y = get_batch("train")      # (12, 64) each; y is x shifted left by one token

`Batches` draws the same kind of windows as numpy arrays, from a numpy Generator it exposes (`rng`), so
that a checkpoint can keep where the draws stand (chapter 12).
"""

import numpy as np
import torch


def split_tokens(tokens, train_fraction=0.9):
    """The first 90% (by default) of the ids for training, the rest for validation."""
    cut = int(len(tokens) * train_fraction)
    return tokens[:cut], tokens[cut:]


def make_get_batch(tokens, block_size, batch_size, train_fraction=0.9, seed=0, device="cpu"):
    """A function `get_batch(split) -> (x, y)` of LongTensors of shape (batch_size, block_size).

    Each row is a random window of the split: x = tokens[i : i+T], y = tokens[i+1 : i+T+1].
    The windows come from one generator seeded with `seed`, so a run is reproducible.
    """
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    splits = dict(zip(("train", "val"), split_tokens(tokens, train_fraction)))
    for name, data in splits.items():
        if len(data) <= block_size:
            raise ValueError(f"the {name} split has {len(data)} tokens, fewer than block_size + 1 = {block_size + 1}")
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.arange(block_size)

    def get_batch(split):
        data = splits[split]
        starts = torch.randint(len(data) - block_size, (batch_size,), generator=gen)
        idx = starts[:, None] + offsets          # (B, T) positions
        return data[idx].to(device), data[idx + 1].to(device)

    return get_batch


class Batches:
    """Random (x, y) windows of the "train" or "val" split as (batch_size, block_size) int64 numpy arrays.

    Every window comes from `rng`, a numpy Generator seeded with `seed`: two Batches with the same
    arguments draw the same windows in the same order, and `rng.bit_generator.state` (a dict) is where
    the draws stand, to keep and to put back."""

    def __init__(self, tokens, block_size, batch_size, seed=0, train_fraction=0.9):
        tokens = np.asarray(tokens, dtype=np.int64)
        self.splits = dict(zip(("train", "val"), split_tokens(tokens, train_fraction)))
        for name, data in self.splits.items():
            if len(data) <= block_size:
                raise ValueError(f"the {name} split has {len(data)} tokens, fewer than block_size + 1 = "
                                 f"{block_size + 1}")
        self.block_size, self.batch_size = block_size, batch_size
        self.rng = np.random.default_rng(seed)

    def get(self, split):
        data = self.splits[split]
        starts = self.rng.integers(0, len(data) - self.block_size, self.batch_size)
        idx = starts[:, None] + np.arange(self.block_size)
        return data[idx], data[idx + 1]
