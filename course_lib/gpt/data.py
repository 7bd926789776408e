"""Batches of (input, target) windows cut at random from a 1-D tensor of token ids.

    get_batch = make_get_batch(tokens, block_size=64, batch_size=12)
    x, y = get_batch("train")      # (12, 64) each; y is x shifted left by one token
"""

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
