"""A small CNN for the 8x8 digits, built twice: on our custom ops, and on torch.nn for comparison.

    1x8x8 -> conv 3x3 (16) -> bias+ReLU -> maxpool 2 -> conv 3x3 (32) -> bias+ReLU -> maxpool 2 -> linear 10

The custom version uses Conv2dIm2col (without its bias), the fused Numba BiasReLU and the
Numba MaxPool2d; its weights start from the same draw as nn.Conv2d's, so the two nets
differ only in the ops they run.
"""

import time

import numpy as np
import torch
from torch import nn

from course_lib.custom_ops import functions as fn


class CustomConvReLU(nn.Module):
    """conv (no bias) then the fused bias + ReLU: the parameters of an nn.Conv2d."""

    def __init__(self, c_in, c_out, k, padding):
        super().__init__()
        ref = nn.Conv2d(c_in, c_out, k, padding=padding)       # borrow its initialisation
        self.weight, self.bias, self.padding = ref.weight, ref.bias, padding

    def forward(self, x):
        zero = torch.zeros_like(self.bias)
        return fn.bias_relu(fn.conv2d_im2col(x, self.weight, zero, 1, self.padding, 1), self.bias)


class DigitsCNN(nn.Module):
    def __init__(self, custom=True):
        super().__init__()
        if custom:
            self.conv1, self.conv2 = CustomConvReLU(1, 16, 3, 1), CustomConvReLU(16, 32, 3, 1)
            self.pool = lambda x: fn.max_pool2d_numba(x, 2)
        else:
            self.conv1 = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU())
            self.conv2 = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU())
            self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(32 * 2 * 2, 10)

    def forward(self, x):
        x = self.pool(self.conv1(x))
        x = self.pool(self.conv2(x))
        return self.head(x.flatten(1))


def train(model, data, epochs=15, batch=64, lr=3e-3, seed=0, progress=None):
    """Adam on cross-entropy; returns (test accuracy, seconds, per-epoch train losses)."""
    X_train, X_test, y_train, y_test = [torch.as_tensor(a) for a in data]
    X_train, X_test = X_train.reshape(-1, 1, 8, 8), X_test.reshape(-1, 1, 8, 8)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    losses, start = [], time.perf_counter()
    epochs_iter = progress(range(epochs)) if progress else range(epochs)
    for _ in epochs_iter:
        order, total = torch.randperm(len(X_train), generator=g), 0.0
        for i in range(0, len(order), batch):
            idx = order[i: i + batch]
            loss = nn.functional.cross_entropy(model(X_train[idx]), y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        losses.append(total / len(order))
    seconds = time.perf_counter() - start
    with torch.no_grad():
        acc = (model(X_test).argmax(1) == y_test).float().mean().item()
    return acc, seconds, np.array(losses)
