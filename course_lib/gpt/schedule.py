"""The learning-rate schedule of chapter 04's recipe: a linear warmup, then a cosine down to a floor.

Lesson 04, section 7, plots it and says why a run warms up before it decays; trainer.py's loop sets
each step's rate from it. Chapter 12 asks you to write this very function on your own, so it is also
the course's answer to exercise 12.10: read it once that check passes.
"""

import math


def lr_at(it, cfg):
    """The course's answer to exercise 12.10 (`lr_schedule`): read it once your check passes.

    Linear warmup from lr/warmup_iters to lr, then a cosine down to min_lr at lr_decay_iters."""
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / cfg.warmup_iters
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    progress = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)
