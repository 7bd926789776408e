"""Chapter 12 assembled: chapter 04's GPT and its whole training, all of it yours, on your own library.

    from course_lib.yours import ch12_capstone as capstone
    lib = capstone.assemble()                  # checks your saved pieces again; one line says whose run
    model = lib.GPT.from_torch(torch_gpt)      # your GPT, holding chapter 04's weights
    optimizer = lib.configure_optimizer(model, cfg)
    with lib.running():                        # your Functions, your order and your kernels, in the block
        history = lib.train(model, optimizer, batches, cfg)

What runs where, inside `lib.running()`:

    elementwise ops, sums, copies, products                 your chapter 06 kernels ("yours-numba"; max and
                                                              where, which chapter 06 did not ask for: the course's)
    x * y and .sum()                                          your chapter 02 Mul and Sum
    the backward of every @                                   your chapter 02 matmul_backward
    the loss                                                  your chapter 02 log_softmax, cross_entropy
    the order loss.backward() walks the graph in              your chapter 01 topological_order
    softmax, GELU, layer norm, embeddings, masked fill        your chapter 12 Functions
    attention, the blocks, the GPT                            your chapter 12 CausalAttention, Block, GPT
    the optimizer, its groups, the schedule, clipping         your AdamW (its moments: your chapter 02
                                                              adam_step), param_groups, lr_at, clip_grad_norm
    the loop, its checkpoints, sampling                       your train, save/load_checkpoint, generate

A piece you have not saved (or turned off with `yours.use`) is the course's, and `assemble` says so.
Where your piece runs inside another, the other one decides: your Block runs inside your GPT, your
lr_at inside your train. The library's own Functions still run the views (reshape, transpose, slices)
and add, subtract and divide; their numbers come from your kernels. Each training step is the recipe's
own (gpt/trainer.train_step) on `lib.library`, the recipe's `Library` of your optimizer and clipping.

How the pieces get in: through the library's declared plug-in points only. Your Functions and your order
go into the op registry (`course_lib.tensor.use_ops`), the kernels are a registered backend
(`use_backend`), your chapter 02 numpy pieces are the pieces in force of adapters.py's Functions. Your
chapter 02 Mul and Sum compute with the loops your chapter 02 module names `strided_zip` and
`strided_reduce`, Python loops thousands of times too slow for a GPT: the registry runs copies of their
forwards in which those two names are the backend's zip and reduce (adapters.rebound; your module is
not touched). The payoff's measurements are in meter.py.
"""

import contextlib
import functools
import sys

import course_lib.tensor as ct
from course_lib import yours
from course_lib.capstone import functions as course_functions
from course_lib.capstone import model as course_model
from course_lib.capstone import optim as course_optim
from course_lib.capstone import sample as course_sample
from course_lib.capstone import train as course_train
from course_lib.gpt import trainer
from course_lib.gpt.trainer import Library
from course_lib.tensor import autodiff, use_backend, use_ops
from course_lib.tensor import functions as F
from course_lib.yours import numba_backend
from course_lib.yours import tensor as yours_tensor
from course_lib.yours.adapters import (
    CrossEntropyOfYours,
    MatMulWithYourBackward,
    Metered,
    ModelOfYours,
    MulOfYours,
    OrderOfYours,
    SumOfYours,
    backend_reduce,
    backend_zip,
    pieces_in_force,
    rebound,
)
from course_lib.yours.autograd import COURSE as COURSE_01

# ---- the course's version of each piece, used where yours is not saved --------------------------------

COURSE_12 = {"Softmax": course_functions.Softmax, "GELU": course_functions.GELU,
             "LayerNorm": course_functions.LayerNorm, "Embedding": course_functions.Embedding,
             "MaskedFill": course_functions.MaskedFill, "CausalAttention": course_functions.CausalAttention,
             "Block": course_model.Block, "GPT": course_model.GPT,
             "param_groups": course_optim.param_groups, "AdamW": course_optim.AdamW, "lr_at": course_optim.lr_at,
             "clip_grad_norm": course_optim.clip_grad_norm, "save_checkpoint": course_train.save_checkpoint,
             "load_checkpoint": course_train.load_checkpoint, "train": course_train.train,
             "generate": course_sample.generate}
REGISTRY_NAME = {"Softmax": "Softmax", "GELU": "GELUTanh", "LayerNorm": "LayerNorm", "Embedding": "Embedding",
                 "MaskedFill": "MaskedFill"}   # the op registry's name of each exercise's Function
INSIDE = {"CausalAttention": "GPT", "Block": "GPT", "lr_at": "train", "save_checkpoint": "train",
          "load_checkpoint": "train"}       # a piece that runs only as the other one calls it
PIECES_02 = ("Mul", "Sum", "matmul_backward", "log_softmax", "cross_entropy", "adam_step")


def _is_mine(piece, chapter):
    return getattr(piece, "__module__", None) == f"course_yours_ch{chapter}"


def _runs_on_loops(cls, loop):
    """Whether the forward of your Function computes with the loop of that name (as the exercise asks)."""
    forward = cls.__dict__.get("forward")
    code = getattr(getattr(forward, "__func__", forward), "__code__", None)
    return code is not None and loop in code.co_names


class Capstone:
    """The GPT and its training on an assembly of pieces: whose code runs what is in `mine` and `course`
    ({chapter: names}), which `line()` says."""

    def __init__(self, p12, p02, p01, backend):
        self.backend = backend
        self.mine = {"01": [], "02": [], "06": sorted({k for _, k in backend.whose() if k}), "12": []}
        self.course = {"01": [], "02": [], "06": [op for op, k in backend.whose() if not k], "12": []}
        self.functions, self.pieces = {}, {}     # the op registry's entries; the pieces in force for adapters
        self._chapter_12(p12)
        self._chapter_02(p02)
        self._chapter_01(p01)
        adam_step = Metered(self._whose(p02["adam_step"], "02"), "adam_step", p02["adam_step"])
        self.AdamW = functools.partial(p12["AdamW"], adam_step=adam_step)
        self.param_groups, self.clip_grad_norm = p12["param_groups"], p12["clip_grad_norm"]
        # positional, as Library's fields stand in either order of its second field's name (AdamW / optimizer)
        self.library = Library("your library", self.AdamW, self.clip_grad_norm, ct.no_grad)
        self.GPT = ModelOfYours(p12["GPT"])
        self._train, self._generate = p12["train"], p12["generate"]

    def _whose(self, piece, chapter):
        return "yours" if _is_mine(piece, chapter) else "course"

    def _book(self, chapter, label, whose):
        (self.mine if whose == "yours" else self.course)[chapter].append(label)

    def _chapter_12(self, p12):
        for name in COURSE_12:
            owner = INSIDE.get(name)
            runs = p12[name]
            if owner is not None and _is_mine(p12[owner], "12"):    # what the learner's GPT or train calls
                runs = vars(sys.modules[p12[owner].__module__]).get(name, runs)
            elif owner is not None:
                runs = COURSE_12[name]                              # the course's GPT or train calls its own
            self._book("12", name, self._whose(runs, "12"))
            if name in REGISTRY_NAME:
                self.functions[REGISTRY_NAME[name]] = runs

    def _chapter_02(self, p02):
        for name, loop in (("Mul", "strided_zip"), ("Sum", "strided_reduce")):
            piece = p02[name]
            if _is_mine(piece, "02") and _runs_on_loops(piece, loop):
                self.functions[name] = MulOfYours if name == "Mul" else SumOfYours
                self.pieces[name] = piece
                self.pieces[f"{name}.forward"] = rebound(piece.forward, strided_zip=backend_zip,
                                                         strided_reduce=backend_reduce)
                self._book("02", name, "yours")
            else:   # the course's; or yours computes with a loop of its own, too slow for a GPT
                self.functions[name] = getattr(F, name)
                self._book("02", name, "course")
        for piece in ("matmul_backward", "log_softmax", "cross_entropy"):
            self.pieces[piece] = Metered("yours", piece, p02[piece])
        if _is_mine(p02["matmul_backward"], "02"):
            self.functions["MatMul"] = MatMulWithYourBackward
            self._book("02", "matmul_backward", "yours")
        else:
            self.functions["MatMul"] = F.MatMul
            self._book("02", "MatMul", "course")
        if _is_mine(p02["log_softmax"], "02") and _is_mine(p02["cross_entropy"], "02"):
            self.functions["CrossEntropy"] = CrossEntropyOfYours
            self._book("02", "log_softmax", "yours")
            self._book("02", "cross_entropy", "yours")
        else:
            self.functions["CrossEntropy"] = F.CrossEntropy
            self._book("02", "CrossEntropy", "course")
        self._book("02", "adam_step", self._whose(p02["adam_step"], "02"))

    def _chapter_01(self, p01):
        order = p01["topological_order"]
        if _is_mine(order, "01"):
            self.functions["topological_order"] = Metered("yours", "topological_order", OrderOfYours(order))
            self._book("01", "topological_order", "yours")
        else:
            self.functions["topological_order"] = Metered("course", "topological_order", autodiff.topological_order)
            self._book("01", "topological_order", "course")

    # ---- running it
    @contextlib.contextmanager
    def running(self):
        """Inside the block, the library's ops are these Functions, its kernels this backend's, and the
        adapters' pieces these."""
        with pieces_in_force(self.pieces), use_ops(**self.functions), use_backend(self.backend.name):
            yield self

    def configure_optimizer(self, model, cfg):
        """Your AdamW on your param_groups of the model, with cfg's lr, betas and weight decay."""
        return self.AdamW(self.param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=tuple(cfg.betas))

    def step(self, model, optimizer, x, y, grad_clip=1.0):
        """The recipe's training step (gpt/trainer.train_step) on your library."""
        return trainer.train_step(model, optimizer, x, y, grad_clip, self.library)

    def train(self, model, optimizer, batches, cfg, **options):
        """Your train (the course's where yours is not saved) on your library."""
        return self._train(model, optimizer, batches, cfg, self.library, **options)

    def generate(self, model, idx, max_new_tokens, temperature, top_k, draw):
        return self._generate(model, idx, max_new_tokens, temperature, top_k, draw)

    def line(self):
        """One line: whose pieces run the GPT and its training, chapter by chapter."""
        parts = []
        for chapter in sorted(set(self.mine) | set(self.course)):
            mine, course = self.mine.get(chapter, []), self.course.get(chapter, [])
            if chapter == "06":
                said = [f"your kernels {', '.join(mine)}", f"the course's kernels for {', '.join(course)}"] if mine \
                    else ["the course's kernels (none of yours saved, or yours.use(\"06\", False))"]
            else:
                said = ([f"your {', '.join(mine)}"] if mine else []) + \
                       ([f"the course's {', '.join(course)}"] if course else [])
            parts.append(f"chapter {chapter}: {'; '.join(said)}")
        return "whose pieces run the GPT and its training. " + ". ".join(parts) + "."


def assemble(verify=True, quiet=False):
    """Your chapter 01, 02, 06 and 12 pieces (the course's where yours are not saved) as a GPT's library."""
    p12 = yours.pieces("12", reference=COURSE_12, verify=verify, quiet=True)
    p02 = yours.pieces("02", reference={n: yours_tensor.COURSE[n] for n in PIECES_02}, verify=verify, quiet=True)
    p01 = yours.pieces("01", reference={"topological_order": COURSE_01["topological_order"]}, verify=verify,
                       quiet=True)
    lib = Capstone(p12, p02, p01, numba_backend.build(verify=verify, quiet=True))
    if not quiet:
        print(lib.line())
    return lib
