"""Chapter 11: distributed training from scratch on torch.distributed (gloo on CPU processes, NCCL on GPUs).

- `launch`           start p worker processes safely: a free port, timeouts, a supervisor, `Code` for notebook code
- `collectives`      the ring all-reduce from send/recv (reduce-scatter, then all-gather), its schedule and cost
- `ddp`              data parallelism: broadcast, gradient hooks, buckets all-reduced during backward, average once
- `zero`             ZeRO-1: AdamW with its state sharded over the ranks, updated shards all-gathered
- `tensor_parallel`  the GPT's MLP split column-parallel then row-parallel, Megatron's f and g
- `workers`          what the workers run in the lesson and tests, and the single-process references
"""

from course_lib.distributed.collectives import ring_all_reduce, ring_schedule  # noqa: F401
from course_lib.distributed.ddp import DDP  # noqa: F401
from course_lib.distributed.launch import Code, WorkerError, launch  # noqa: F401
from course_lib.distributed.tensor_parallel import ParallelMLP  # noqa: F401
from course_lib.distributed.zero import ZeroAdamW  # noqa: F401
