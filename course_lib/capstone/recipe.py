"""Chapter 04's training recipe (course_lib/gpt/trainer.py) with the capstone's pieces: what chapter 13's
compiler, the tests and the benchmarks train the course's GPT with.

`COURSE` is the recipe's `Library` of the course's answers: their AdamW, their clipping, the tensor
library's no_grad. The step is the recipe's own `train_step`, on that library.

    optimizer = configure_optimizer(model, cfg)
    loss = train_step(model, optimizer, x, y)
"""

from course_lib.capstone.optim import AdamW, clip_grad_norm, param_groups
from course_lib.gpt import trainer
from course_lib.gpt.trainer import Library
from course_lib.tensor import no_grad

# positional, so that it reads the same whether Library's second field is named `AdamW` or `optimizer`
COURSE = Library("course_lib.capstone", AdamW, clip_grad_norm, no_grad)


def configure_optimizer(model, cfg):
    """The course's AdamW on the capstone's two groups (decay the matrices only), with cfg's lr and betas."""
    return AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=tuple(cfg.betas))


def train_step(model, optimizer, x, y, grad_clip=1.0):
    """The recipe's step (forward, backward, clipping, update) on the course's library."""
    return trainer.train_step(model, optimizer, x, y, grad_clip, COURSE)
