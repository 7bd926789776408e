"""The course's answers to exercises 12.12 (`checkpoint`) and 12.13 (`train`): read them once your checks pass.

The loop is chapter 04's (gpt/trainer.py: the same history, evaluation every eval_interval steps and at
the end), and each step is the recipe's own `gpt.trainer.train_step` on the library `lib` names. A
checkpoint holds everything the next step reads: the weights, the optimizer's moments and steps, and the
state of the generator that draws the batches; so a run resumed from it goes on exactly as if it had never
stopped.
"""

import pickle

from course_lib.capstone.optim import lr_at
from course_lib.gpt.trainer import train_step


def save_checkpoint(path, it, model, optimizer, batches):
    """The course's answer to exercise 12.12 (`checkpoint`): read it once your check passes.

    The number of steps done, the weights, the optimizer's state and the batches' generator, pickled."""
    state = {"iter": it, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "batches": batches.rng.bit_generator.state}
    with open(path, "wb") as f:
        pickle.dump(state, f)


def load_checkpoint(path, model, optimizer, batches):
    """The course's answer to exercise 12.12 (`checkpoint`): read it once your check passes.

    Puts back what save_checkpoint kept; returns the number of steps done."""
    with open(path, "rb") as f:
        state = pickle.load(f)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    batches.rng.bit_generator.state = state["batches"]
    return state["iter"]


def evaluate(model, batches, eval_iters, lib):
    """Mean loss over eval_iters batches of each split, in eval mode, with no graph recorded."""
    model.eval()
    with lib.no_grad():
        means = {split: sum(float(model(*batches.get(split))[1]) for _ in range(eval_iters)) / eval_iters
                 for split in ("train", "val")}
    model.train()
    return means


def train(model, optimizer, batches, cfg, lib, checkpoint=None, save_every=0, resume=False):
    """The course's answer to exercise 12.13 (`train`): read it once your check passes.

    Steps from 0 (or from the checkpoint's step, with resume) to cfg.max_iters: an evaluation first when
    the step is a multiple of cfg.eval_interval, the learning rate of the schedule, a batch, the recipe's
    step; a checkpoint after every save_every-th step; a last evaluation at the end. Returns chapter 04's
    history (iter, lr, loss; eval_iter, train_loss, val_loss)."""
    history = {"iter": [], "lr": [], "loss": [], "eval_iter": [], "train_loss": [], "val_loss": []}

    def log_evaluation(it):
        means = evaluate(model, batches, cfg.eval_iters, lib)
        history["eval_iter"].append(it)
        history["train_loss"].append(means["train"])
        history["val_loss"].append(means["val"])

    start = load_checkpoint(checkpoint, model, optimizer, batches) if resume else 0
    model.train()
    for it in range(start, cfg.max_iters):
        if cfg.eval_interval and it % cfg.eval_interval == 0:
            log_evaluation(it)
        lr = lr_at(it, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = batches.get("train")
        loss = train_step(model, optimizer, x, y, cfg.grad_clip, lib)
        history["iter"].append(it)
        history["lr"].append(lr)
        history["loss"].append(float(loss))
        if checkpoint is not None and save_every and (it + 1) % save_every == 0:
            save_checkpoint(checkpoint, it + 1, model, optimizer, batches)
    log_evaluation(cfg.max_iters)
    return history
