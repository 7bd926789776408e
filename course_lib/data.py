"""The course's data, all offline: two moons, scikit-learn's digits, and a text corpus.

Nothing here downloads. Every generator takes a seed, so a notebook run twice sees the
same numbers.
"""

from pathlib import Path

import numpy as np


def make_moons(n=100, noise=0.1, seed=0):
    """Two interleaving half circles in 2-D: X of shape (n, 2) float64, y of shape (n,) in {0, 1}.

    The first half of the points (rounded down) is moon 0, the rest moon 1.
    """
    rng = np.random.default_rng(seed)
    n0 = n // 2
    n1 = n - n0
    t0 = np.linspace(0, np.pi, n0)
    t1 = np.linspace(0, np.pi, n1)
    upper = np.stack([np.cos(t0), np.sin(t0)], axis=1)
    lower = np.stack([1 - np.cos(t1), 0.5 - np.sin(t1)], axis=1)
    X = np.concatenate([upper, lower]) + noise * rng.standard_normal((n, 2))
    y = np.concatenate([np.zeros(n0, dtype=np.int64), np.ones(n1, dtype=np.int64)])
    return X, y


def load_digits(test_fraction=0.2, seed=0):
    """scikit-learn's bundled 8x8 digits (1,797 images), split once with a fixed seed.

    Returns (X_train, X_test, y_train, y_test): X is float32 in [0, 1] with 64 columns
    (reshape to (-1, 1, 8, 8) for images), y is int64 in 0..9.
    """
    from sklearn.datasets import load_digits as sk_digits

    d = sk_digits()
    X = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(X))
    n_test = int(round(len(X) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return X[train], X[test], y[train], y[test]


def load_text(path=None):
    """A text corpus as one string.

    By default: the help topics that ship with Python (`pydoc_data.topics`), joined in
    sorted key order, about 465,000 characters of English and code. Pass a path to use
    any UTF-8 text file instead.
    """
    if path is not None:
        return Path(path).read_text(encoding="utf-8")
    from pydoc_data.topics import topics

    return "\n".join(topics[k] for k in sorted(topics))


def split_text(text, train_fraction=0.9):
    """The first 90% (by default) for training, the rest for validation."""
    cut = int(len(text) * train_fraction)
    return text[:cut], text[cut:]
