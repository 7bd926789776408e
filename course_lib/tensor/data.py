"""A tiny DataLoader: shuffle (seeded) and cut into batches of Tensors."""

from __future__ import annotations

import numpy as np

from course_lib.tensor.tensor import Tensor


class DataLoader:
    """Iterate (x, y) batches over arrays. x becomes a Tensor; y stays integer labels (numpy)."""

    def __init__(self, x, y, batch_size: int = 64, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, dtype=np.float32):
        if len(x) != len(y):
            raise ValueError(f"DataLoader: x has {len(x)} rows but y has {len(y)}")
        self.x, self.y = np.asarray(x, dtype=dtype), np.asarray(y)
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        n, b = len(self.x), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def __iter__(self):
        order = self.rng.permutation(len(self.x)) if self.shuffle else np.arange(len(self.x))
        for i in range(len(self)):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield Tensor(self.x[idx]), self.y[idx]
