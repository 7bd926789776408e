"""Sampling text from a GPT: temperature, top-k, and a KV cache so each new token costs one position.

    ids = generate(model, prompt_ids, max_new_tokens=200, temperature=0.8, top_k=20)
"""

import torch
import torch.nn.functional as F

from course_lib.gpt.model import KVCache


def top_k_filter(logits, k):
    """Keep the k largest logits of each row and set the rest to -inf (ties at the k-th value kept)."""
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
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, generator=None):
    """Append max_new_tokens sampled ids to idx (B, T) and return the (B, T + max_new_tokens) tensor.

    Without a cache, every step reruns the model on the whole context (cropped to block_size).
    With the cache, the prompt runs once and then each step feeds only the newest token. Once the
    context is longer than block_size, the positions of all kept tokens shift, so the cache is
    rebuilt from the cropped context: both ways give the same tokens.
    """
    model.eval()
    block_size = model.config.block_size
    cache, fed = None, 0     # `fed`: how many tokens of idx the cache already holds
    for _ in range(max_new_tokens):
        if not use_cache:
            logits, _ = model(idx[:, -block_size:])
        elif cache is not None and idx.size(1) <= block_size:
            logits, _ = model(idx[:, fed:], cache=cache)      # just the token(s) not seen yet
        else:
            cache = KVCache(len(model.transformer.h))           # (re)fill from the cropped context
            logits, _ = model(idx[:, -block_size:], cache=cache)
        fed = idx.size(1)
        next_id = sample_next(logits[:, -1, :], temperature, top_k, generator)
        idx = torch.cat([idx, next_id], dim=1)
    return idx
