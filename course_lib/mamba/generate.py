"""Sampling from a Mamba LM with a fixed-size recurrent state: every new token costs one step.

    ids = generate(model, prompt_ids, max_new_tokens=200, temperature=0.8, top_k=20)

The prompt runs once as a full sequence (the parallel scan), which leaves the final conv and SSM
states in a `MambaCache`; then each new token is one `step` per layer. Without the cache, every step
reruns the whole sequence: slower, and the same tokens.
"""

import torch

from course_lib.gpt.generate import sample_next
from course_lib.mamba.model import MambaCache


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, generator=None):
    """Append max_new_tokens sampled ids to idx (B, T); returns (B, T + max_new_tokens)."""
    model.eval()
    cache = MambaCache(model.config.n_layer) if use_cache else None
    fed = 0
    for _ in range(max_new_tokens):
        logits, _ = model(idx[:, fed:] if use_cache else idx, cache=cache)
        fed = idx.size(1)
        next_id = sample_next(logits[:, -1, :], temperature, top_k, generator)
        idx = torch.cat([idx, next_id], dim=1)
    return idx
