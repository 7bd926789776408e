"""Failures on purpose, to watch the supervisor of `launch` stop every worker and name the one that failed."""

import os
import signal
import time

import torch
import torch.distributed as dist


def fail_at_step(victim, at_step, how="kill", steps=6):
    """All ranks all-reduce in a loop; at `at_step`, rank `victim` is killed (SIGKILL), raises, or hangs."""
    x = torch.randn(4, dtype=torch.float64)
    for step in range(steps):
        if dist.get_rank() == victim and step == at_step:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "hang":
                time.sleep(3600)   # the others wait in their all-reduce until its timeout
            raise ValueError(f"rank {victim} gives up at step {step}")
        dist.all_reduce(x)
    return x
