"""Chapter 11: distributed training from scratch on torch.distributed (gloo on CPU processes, NCCL on GPUs).

The tools the lesson uses:
- `launch`           start p worker processes safely: a free port, timeouts, a supervisor, `Code` for notebook code
- `cost`             what a ring all-reduce costs (the latency-bandwidth model), its schedule on paper, a fit
- `problems`         seeded toy problems and chapter 04's GPT on a toy task, with their one-process oracles
- `faults`           a worker that dies, raises or hangs on purpose, to show the supervisor at work
- `timing`           what the lesson and the benchmarks measure: collectives' times, DDP steps, optimizer
                     state (the pieces to measure come in as arguments)

The rest of the package is the course's own answers to the chapter's exercises (the ring all-reduce, DDP,
ZeRO-1, f and g, the tensor-parallel MLP) and the training runs built on them. Each answer starts with
the line "The course's answer to exercise 11.k ...: read it once your check passes"; course_lib/answer_key.py
says which file holds which. Read each one after your check of it passes. Nothing above imports them, so
importing this package, or any tool listed above, runs none of them.
"""

from course_lib.distributed.launch import Code, WorkerError, carry, launch  # noqa: F401
