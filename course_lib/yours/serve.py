"""Chapter 14 assembled from your pieces: your block manager, paged attention, scheduler, acceptance rule
and int8 kernel serving chapter 04's GPT.

    from course_lib.yours import serve
    pieces = serve.assemble()                             # one line says which pieces are yours
    engine = pieces.engine(gpt, num_blocks=128, block_size=16)    # your scheduler and block manager
    int8_model = pieces.int8(pieces.model(gpt, 128, 16))  # your quantize and int8_matmul
    tokens, stats = pieces.speculative(target, draft, prompt, max_tokens=64, k=4)

What runs where: the engine (serve/engine.py) calls your `schedule` at every step, which calls your
`BlockManager`; the model (serve/model.py) runs its attention with your `paged_attention`; speculative
decoding (serve/speculative.py) keeps or rejects drafts with your `accept`; the int8 model quantizes with
your `quantize` and multiplies with your `int8_matmul`. They plug in through the parameters those classes
take (`schedule=`, `block_manager=`, `attention=`, `accept`), never by replacing a library attribute.
A piece you have not saved (or turned off with `yours.use("14", False)`) is the course's.
"""

import numpy as np

from course_lib import yours
from course_lib.serve import acceptance, blocks, int8, paged_attention, scheduler
from course_lib.serve.engine import Engine
from course_lib.serve.model import PagedGPT
from course_lib.serve.speculative import speculative_generate

COURSE = {"BlockManager": blocks.BlockManager,
          "paged_attention": paged_attention.paged_attention,
          "schedule": scheduler.schedule,
          "accept": acceptance.accept,
          "quantize": int8.quantize,
          "int8_matmul": int8.int8_matmul}


class Pieces:
    """Your chapter 14 pieces (the course's where yours are not saved), as the serving stack's parts."""

    def __init__(self, pieces):
        self.pieces = pieces

    def mine(self):
        """The names of the pieces that are yours."""
        return [name for name, f in self.pieces.items() if f is not COURSE[name]]

    def model(self, gpt, num_blocks, block_size, dtype=np.float32):
        """A PagedGPT of `gpt` whose attention is your paged_attention."""
        return PagedGPT.from_gpt(gpt, num_blocks, block_size, dtype, attention=self.pieces["paged_attention"])

    def engine(self, gpt, num_blocks, block_size, dtype=np.float32, **kwargs):
        """An engine on your scheduler, your block manager and your attention."""
        return Engine(self.model(gpt, num_blocks, block_size, dtype), schedule=self.pieces["schedule"],
                      block_manager=self.pieces["BlockManager"], **kwargs)

    def int8(self, model):
        """The same model with int8 weights, by your quantize and int8_matmul."""
        return model.quantized(self.pieces["quantize"], self.pieces["int8_matmul"])

    def speculative(self, target, draft, prompt, max_tokens, k=4, temperature=0.0, seed=0):
        """Speculative decoding of PagedGPTs with your acceptance rule."""
        return speculative_generate(target, draft, prompt, max_tokens, k, self.pieces["accept"], temperature, seed)


def assemble(quiet=False):
    """Your chapter 14 pieces (the course's where yours are not saved), checked again before use."""
    return Pieces(yours.pieces("14", reference=COURSE, quiet=quiet))
