"""Chapter 13 assembled from your pieces: the course's compiler, running your code where you wrote it.

    from course_lib.yours import compiler
    pieces = compiler.assemble()                   # one line says whose pieces run
    step = compiler.compile(train_step, pieces)    # course_lib.compiler.compile, with your pieces

What runs where:
    every backend call of a capture          your record (the tracer's recording of one call)
    every node offered to a fused group      your can_join (the fusion rule)
    every kernel of a group without a        your pointwise_source (the loop of one pointwise group)
      reduction whose loads are plain
    every call of a compiled step            your guard (may this call replay?)
The rest is the course's: the tracing backend and op mode, the second capture that confirms the first,
the grouping walk, the kernels of groups with reductions, Numba, the memory plan and the replay.
A piece you have not saved (or turned off with `yours.use("13", False)`) is the course's.
"""

from course_lib import yours
from course_lib.compiler import Pieces
from course_lib.compiler import compile as course_compile
from course_lib.compiler.answers import can_join, guard, pointwise_source, record

COURSE = {"record": record, "can_join": can_join, "pointwise_source": pointwise_source, "guard": guard}


def assemble(quiet=False):
    """Your chapter 13 pieces (the course's where yours are not saved) as the compiler's Pieces."""
    p = yours.pieces("13", reference=COURSE, quiet=quiet)
    return Pieces(record=p["record"], can_join=p["can_join"], pointwise=p["pointwise_source"], guard=p["guard"])


def compile(fn, pieces=None, verbose=True):
    """course_lib.compiler.compile(fn) with your pieces (assembled now if not given)."""
    return course_compile(fn, pieces=pieces or assemble(), verbose=verbose)
