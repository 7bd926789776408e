"""Chapter 12 assembled from your pieces: chapter 04's GPT, trained on the code you wrote.

    from course_lib.yours import capstone
    parts = capstone.assemble()              # one line per chapter says whose pieces run
    model = parts.GPT.from_torch(torch_gpt)  # chapter 04's weights, your attention in every block
    with parts.running():                    # your backwards inside the library, while the block runs
        logits, loss = model(x, y)

What runs where:
    every block's attention       your causal_self_attention (chapter 12)
    every LayerNorm's backward    your layer_norm_backward (chapter 12)
    both embeddings' backward     your embedding_backward (chapter 12)
    every `@`'s backward          your matmul_backward (chapter 02)
    every AdamW update            your adam_step (chapter 02), after the decoupled weight decay
    every kernel, optionally      your chapter 06 kernels: `with use_backend(parts.numba_backend())`
A piece you have not saved (or turned off with `yours.use`) is the course's.
"""

import contextlib
from types import SimpleNamespace

import numpy as np

import course_lib.tensor as ct
from course_lib import yours
from course_lib.capstone import model as capstone_model
from course_lib.capstone.train import configure_optimizer as course_optimizer
from course_lib.tensor import functions as F
from course_lib.tensor import optim
from course_lib.tensor.tensor_data import TensorData
from course_lib.yours import tensor as yours_tensor

_COURSE = {"LayerNorm": F.LayerNorm, "Embedding": F.Embedding}


# ---- the course's version of each chapter 12 piece ---------------------------------------------------

def _course_layer_norm_backward(grad, xhat, r, weight):
    ctx = SimpleNamespace(xhat=xhat, r=r, weight=weight)
    return _COURSE["LayerNorm"].backward(ctx, grad)


def _course_embedding_backward(grad, idx, num_embeddings):
    ctx = SimpleNamespace(idx=np.asarray(idx), shape=(num_embeddings, grad.shape[-1]))
    return _COURSE["Embedding"].backward(ctx, ct.Tensor(grad, dtype=grad.dtype)).numpy()


def _course_attention(x, c_attn, c_proj, n_head):
    config = SimpleNamespace(n_embd=x.shape[-1], n_head=n_head, block_size=x.shape[1], dropout=0.0)
    attention = capstone_model.CausalSelfAttention(config, x.dtype)
    attention.c_attn, attention.c_proj = c_attn, c_proj
    return attention(x)


COURSE = {"layer_norm_backward": _course_layer_norm_backward,
          "embedding_backward": _course_embedding_backward,
          "causal_self_attention": _course_attention}


def _tensor(x, like):
    return x if isinstance(x, ct.Tensor) else ct.Tensor(np.asarray(x), dtype=like.dtype)


def assemble(quiet=False):
    """Your chapter 12 and chapter 02 pieces (the course's where yours are not saved) as a GPT's parts."""
    p = yours.pieces("12", reference=COURSE, quiet=quiet)
    ch02 = yours_tensor.assemble(quiet=quiet)

    class LayerNorm(F.LayerNorm):
        """The course's forward (it saves xhat and r); the backward is your layer_norm_backward."""

        @staticmethod
        def backward(ctx, grad):
            return tuple(_tensor(g, grad) for g in p["layer_norm_backward"](grad, ctx.xhat, ctx.r, ctx.weight))

    class Embedding(F.Embedding):
        """weight[idx]; the backward is your embedding_backward."""

        @staticmethod
        def backward(ctx, grad):
            rows = p["embedding_backward"](grad.numpy(), ctx.idx, ctx.shape[0])
            rows = rows.numpy() if isinstance(rows, ct.Tensor) else np.asarray(rows)
            return grad._new(TensorData.from_numpy(rows, grad.dtype))

    class Attention(capstone_model.CausalSelfAttention):
        """The course's layers (c_attn, c_proj, dropout); the forward is your causal_self_attention."""

        def forward(self, x):
            return self.resid_dropout(p["causal_self_attention"](x, self.c_attn, self.c_proj, self.n_head))

    class GPT(capstone_model.GPT):
        """The capstone GPT with your attention in every block."""

        def __init__(self, config, dtype=np.float32, attention=Attention):
            super().__init__(config, dtype, attention)

        @classmethod
        def from_torch(cls, torch_gpt, dtype=None, attention=Attention):
            return super().from_torch(torch_gpt, dtype, attention)

    class AdamW(optim.AdamW):
        """Decoupled weight decay (p *= 1 - lr * wd), then your adam_step."""

        def update(self, param, grad, state):
            decay = self.per_element("weight_decay", self.weight_decay, param)
            if decay is not None:
                param = param * (1 - self.lr * decay)
            t = state["t"] = state.get("t", 0) + 1
            zeros = np.zeros(param.shape, param.dtype)
            new, state["m"], state["v"] = ch02.pieces["adam_step"](
                param.numpy(), grad.numpy(), state.get("m", zeros), state.get("v", zeros), t, self.lr,
                *self.betas, self.eps)
            return ct.Tensor(new, dtype=param.dtype)

    def configure_optimizer(model, cfg):
        """As course_lib.capstone's: decay the matrices only; your adam_step does the updates."""
        groups = course_optimizer(model, cfg).param_groups
        return AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas))

    @contextlib.contextmanager
    def running():
        """Inside the block, the library's LayerNorm, Embedding and `@` run your backwards."""
        saved = F.LayerNorm, F.Embedding
        F.LayerNorm, F.Embedding = LayerNorm, Embedding
        try:
            with yours_tensor.matmul_is(ch02.MatMul):
                yield
        finally:
            F.LayerNorm, F.Embedding = saved

    def numba_backend(quiet=False):
        """Your chapter 06 kernels as a backend (the course's where yours are not saved): its name."""
        from course_lib.yours import numba_backend as nb

        nb.build(quiet=quiet)
        return nb.NAME

    return SimpleNamespace(pieces=p, GPT=GPT, Attention=Attention, AdamW=AdamW,
                           configure_optimizer=configure_optimizer, running=running, numba_backend=numba_backend)
