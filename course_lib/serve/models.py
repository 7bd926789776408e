"""The chapter's models: a target GPT and a draft several times smaller, trained deterministically.

    pair = load_pair()               # pair.target, pair.draft (chapter 04 GPTs), pair.tokenizer, pair.val
    pair.ratio                       # the target's parameters over the draft's

Both are chapter 04's GPT trained with chapter 04's loop on the course's corpus (Python's help topics,
one token per character), each from a fixed seed. The "small" pair, the notebooks' and the tests', ships
with the library (serve/small_pair.npz, about 0.5 MB): training it takes a minute on a busy laptop, more
than a notebook's budget. `python -m course_lib.serve.models` trains it again and rewrites the file.
The "bench" pair is the benchmark's, larger; `trained_pair("bench")` trains it in a few minutes.
"""

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from course_lib.data import load_text, split_text
from course_lib.gpt.data import make_get_batch
from course_lib.gpt.model import GPT, GPTConfig
from course_lib.gpt.tokenizers import CharTokenizer
from course_lib.gpt.trainer import TrainConfig, train

# (target config, draft config, training steps, batch, window)
PRESETS = {
    "small": (dict(n_layer=2, n_head=4, n_embd=64), dict(n_layer=1, n_head=2, n_embd=32), 300, 8, 128),
    # the bench draft has one layer: at batch 1 a call's cost is mostly per layer, so depth is what it must save
    "bench": (dict(n_layer=6, n_head=8, n_embd=256), dict(n_layer=1, n_head=4, n_embd=224), 400, 8, 256),
}
CONTEXT = 512          # learned positions: prompts up to 256 tokens and as many generated


@dataclass
class Pair:
    target: GPT
    draft: GPT
    tokenizer: CharTokenizer
    val: torch.Tensor          # the validation split's token ids

    @property
    def ratio(self):
        return self.target.num_params() / self.draft.num_params()


def _train(config, steps, batch, window, tokens, seed):
    torch.manual_seed(seed)
    model = GPT(config)
    cfg = TrainConfig(max_iters=steps, lr=3e-3, min_lr=3e-4, warmup_iters=20, lr_decay_iters=steps,
                      eval_interval=0, eval_iters=1, seed=seed)
    with torch.random.fork_rng():
        train(model, make_get_batch(tokens, window, batch, seed=seed), cfg, False)
    return model.eval()


@functools.cache
def trained_pair(preset="small"):
    """The target and the draft of a preset, trained on the same text (see the module's docstring)."""
    target_cfg, draft_cfg, steps, batch, window = PRESETS[preset]
    tokenizer, val = _corpus()
    tokens = torch.tensor(tokenizer.encode(load_text()), dtype=torch.long)
    models = [_train(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=CONTEXT, **cfg), steps, batch,
                     window, tokens, seed) for cfg, seed in ((target_cfg, 0), (draft_cfg, 1))]
    return Pair(*models, tokenizer, val)


SHIPPED = Path(__file__).with_name("small_pair.npz")


def _corpus():
    text = load_text()
    tokenizer = CharTokenizer(text)
    return tokenizer, torch.tensor(tokenizer.encode(split_text(text)[1]), dtype=torch.long)


@functools.cache
def load_pair(path=SHIPPED):
    """The small pair, as trained by `trained_pair("small")` and shipped with the library (or a pair that
    `write_pair` saved in `path`)."""
    tokenizer, val = _corpus()
    with np.load(path) as f:
        models = []
        for name in ("target", "draft"):
            model = GPT(GPTConfig(**json.loads(str(f[f"{name}.config"]))))
            missing, _ = model.load_state_dict({k.split(".", 1)[1]: torch.from_numpy(f[k]) for k in f.files
                                                if k.startswith(name + ".") and k != f"{name}.config"}, strict=False)
            assert missing == ["lm_head.weight"], missing             # tied to the token embedding
            models.append(model.eval())
    return Pair(*models, tokenizer, val)


def write_pair(pair, path=SHIPPED):
    arrays = {}
    for name, model in (("target", pair.target), ("draft", pair.draft)):
        arrays[f"{name}.config"] = np.array(json.dumps(asdict(model.config)))
        arrays.update({f"{name}.{k}": t.numpy() for k, t in model.state_dict().items()
                       if not k.startswith("lm_head")})      # tied to the token embedding
    np.savez_compressed(path, **arrays)


if __name__ == "__main__":
    write_pair(trained_pair("small"))
    print(f"wrote {SHIPPED}")
