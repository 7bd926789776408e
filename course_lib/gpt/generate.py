"""Sampling text from a language model: temperature, top-k, and a cache so each new token costs one position.

    ids = generate(model, prompt_ids, max_new_tokens=200, temperature=0.8, top_k=20)

`sample` is the loop, written once for every model of the course: this chapter's GPT (a KV cache),
chapter 05's Mamba (a recurrent state, no block size) and chapter 12's GPT on the course's own tensors
(no cache). A model takes part through `forward(ids, cache) -> logits (B, T, vocab)`; `generate` below
is the GPT's.
"""

import torch
import torch.nn.functional as F

from course_lib.gpt.model import KVCache


def top_k_filter(logits, k):
    """The course's answer to exercise 04.7 (`top_k_probs`): read it once your check passes.

    Keep the k largest logits of each row and set the rest to -inf (ties at the k-th value kept)."""
    if k is None or k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]          # the k-th largest, per row
    return logits.masked_fill(logits < kth, float("-inf"))


def sample_next(logits, temperature=1.0, top_k=None, generator=None):
    """One id per row of logits (B, vocab). temperature 0 means greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    probs = F.softmax(top_k_filter(logits / temperature, top_k), dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)


@torch.no_grad()
def sample(forward, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None, block_size=None,
           new_cache=None):
    """Append max_new_tokens sampled ids to idx (B, T) and return the (B, T + max_new_tokens) tensor.

    forward(ids, cache) -> logits (B, T, vocab): the model on `ids`, reading and filling `cache`.
    Without a cache (new_cache None), every step reruns the model on the whole context, cropped to
    block_size (None: no limit). With one, the prompt runs once into new_cache(), and then each step feeds
    only the newest token. Once the context is longer than block_size, the positions of all kept tokens
    shift, so the cache is rebuilt from the cropped context: both ways give the same tokens.
    """
    window = slice(-block_size if block_size else None, None)
    cache, fed = None, 0     # `fed`: how many tokens of idx the cache already holds
    for _ in range(max_new_tokens):
        if new_cache is None:
            logits = forward(idx[:, window], None)
        elif cache is not None and (block_size is None or idx.size(1) <= block_size):
            logits = forward(idx[:, fed:], cache)          # just the token(s) not seen yet
        else:
            cache = new_cache()                            # (re)fill from the cropped context
            logits = forward(idx[:, window], cache)
        fed = idx.size(1)
        next_id = sample_next(logits[:, -1, :], temperature, top_k, generator)
        idx = torch.cat([idx, next_id], dim=1)
    return idx


def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, generator=None):
    """`sample` for this chapter's GPT, with its KV cache (use_cache=False reruns the whole context)."""
    model.eval()
    new_cache = (lambda: KVCache(len(model.transformer.h))) if use_cache else None
    return sample(lambda ids, cache: model(ids, cache=cache)[0], idx, max_new_tokens, temperature, top_k,
                  generator, model.config.block_size, new_cache)
