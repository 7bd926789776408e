"""Chapter 11 assembled from your pieces: chapter 04's GPT trained on several processes by the code you wrote.

    from course_lib.yours import distributed
    parts = distributed.assemble()                     # checks each saved piece again; one line says whose run
    runs, one_process = parts.train_gpt(steps=30)      # {"your ring": losses, ...}, and one process's losses

What runs where (course_lib/distributed/train.py), on 2 worker processes by default:
    "your ring"              your ring_all_reduce sums every gradient, in one flat tensor, after each backward
    "your DDP + ZeRO-1"      your DDP (broadcast, buckets during backward, no_sync, finish) and your
                             ZeroOptimizer around torch's AdamW
    "your tensor parallel"   your ParallelMLP, with your CopyToParallel and ReduceFromParallel, in every block
A piece you have not saved (or turned off with `yours.use("11", False)`) is the course's.

The workers are other processes: they cannot see this notebook, nor import your saved file by name (it
lives in work/yours/, outside Python's path). Each of your pieces travels to them as the text of that
file (`launch.carry`), and runs there as it ran in its check.
"""

from course_lib import yours
from course_lib.distributed import collectives, ddp, problems, train, zero
from course_lib.distributed import tensor_parallel as tp
from course_lib.distributed.launch import carry, launch, preload

COURSE = {"ring_all_reduce": collectives.ring_all_reduce, "DDP": ddp.DDP, "ZeroOptimizer": zero.ZeroOptimizer,
          "CopyToParallel": tp.CopyToParallel, "ReduceFromParallel": tp.ReduceFromParallel,
          "ParallelMLP": tp.ParallelMLP}

preload(train.__name__)

NAMES = {"ring": "your ring", "ddp + zero": "your DDP + ZeRO-1", "tensor parallel": "your tensor parallel"}


class Parts:
    """Your chapter 11 pieces (the course's where yours are not saved), ready to train on worker processes."""

    def __init__(self, pieces):
        self.pieces = pieces

    def mine(self, name):
        return self.pieces[name] is not COURSE[name]

    def train_gpt(self, steps=30, world_size=2, rows=8, seed=0):
        """The GPT trained three ways on `world_size` processes, and in one process on the whole batch.

        Returns ({run name: the global loss of each step}, [one process's loss of each step])."""
        pieces = {name: carry(piece) for name, piece in self.pieces.items()}   # the course's MLP takes your f, g
        per_rank = launch(train.all_three, world_size, steps, pieces, rows, seed, timeout=60, wall_timeout=300)
        runs = {NAMES[name] if self.runs_yours(name) else name: losses for name, losses in per_rank[0].items()}
        return runs, problems.train_gpt(steps, rows, seed)

    def runs_yours(self, run):
        """Whether any of your pieces runs in `run` ("ring", "ddp + zero" or "tensor parallel")."""
        needs = {"ring": ["ring_all_reduce"], "ddp + zero": ["DDP", "ZeroOptimizer"],
                 "tensor parallel": ["ParallelMLP", "CopyToParallel", "ReduceFromParallel"]}[run]
        return any(self.mine(name) for name in needs)


def assemble(quiet=False):
    """Your saved chapter 11 pieces, each checked again (a piece that fails its check stops here, named)."""
    return Parts(yours.pieces("11", reference=COURSE, quiet=quiet))
