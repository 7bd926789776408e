"""Chapter 11: distributed training from scratch on torch.distributed (gloo on CPU processes, NCCL on GPUs).

The tools the lesson uses:
- `launch`           start p worker processes safely: a free port, timeouts, a supervisor, `Code` for notebook code
- `cost`             what a ring all-reduce costs (the latency-bandwidth model), its schedule on paper, a fit
- `problems`         seeded toy problems and chapter 04's GPT on a toy task, with their one-process oracles
- `faults`           a worker that dies, raises or hangs on purpose, to show the supervisor at work

The course's answers to the exercises (imported by name, never from here, so that importing this package
runs none of them):
- `collectives`      the ring all-reduce from send/recv (reduce-scatter, then all-gather)
- `ddp`              data parallelism: broadcast, buckets all-reduced from gradient hooks during backward, no_sync
- `zero`             ZeRO-1 around any optimizer: each rank keeps the state of its shard, an all-gather rejoins them
- `tensor_parallel`  Megatron's f and g, and the GPT's MLP split column-parallel then row-parallel
- `train`            chapter 04's GPT trained on p processes with those pieces (whichever ones it is given)
- `timing`           what the benchmarks time: the ring against gloo's all-reduce, DDP steps, optimizer memory
"""

from course_lib.distributed.launch import Code, WorkerError, carry, launch  # noqa: F401
