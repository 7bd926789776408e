"""Losses: the negative log-likelihood and the softmax cross-entropy, as a training graph exports them."""

import numpy as np

from ..registry import register
from .linalg import log_softmax


def _nll(logp, target, weight, ignore_index, reduction):
    """-logp[n, target[n, ...], ...] (times weight[target]), zero where target == ignore_index; reduced.

    logp: (N, C, d1, ...); target: (N, d1, ...). 'mean' divides by the summed weights of the kept
    targets (their count without weights), as PyTorch's NLLLoss does."""
    keep = np.ones(target.shape, bool) if ignore_index is None else target != ignore_index
    t = np.where(keep, target, 0).astype(np.int64)              # an ignored target may be out of range
    picked = np.take_along_axis(logp, t[:, None], axis=1)[:, 0]
    w = np.ones_like(picked) if weight is None else weight[t].astype(logp.dtype)
    w = np.where(keep, w, 0).astype(logp.dtype)
    loss = -picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum().astype(logp.dtype)
    return (loss.sum() / w.sum()).astype(logp.dtype)


@register("NegativeLogLikelihoodLoss", since=12)
def nll_loss(x, target, weight=None, *, ignore_index=None, reduction="mean"):
    return _nll(x, target, weight, ignore_index, reduction)


@register("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy(scores, labels, weights=None, *, ignore_index=None, reduction="mean", _n_outputs=1):
    """The NLL of log_softmax(scores) over the class axis 1; the log-probabilities are an optional output."""
    logp = log_softmax(scores, axis=1)
    loss = _nll(logp, labels, weights, ignore_index, reduction)
    return (loss, logp)[:_n_outputs] if _n_outputs > 1 else loss
