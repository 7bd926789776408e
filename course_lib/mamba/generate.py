"""Sampling from a Mamba LM with a fixed-size recurrent state: every new token costs one step.

    ids = generate(model, prompt_ids, max_new_tokens=200, temperature=0.8, top_k=20)

Chapter 04's sampling loop (`course_lib.gpt.generate.sample`) with a `MambaCache` in place of the KV
cache. The prompt runs once as a full sequence (the parallel scan), which leaves the final conv and SSM
states in the cache; then each new token is one `step` per layer. Without the cache, every step
reruns the whole sequence: slower, and the same tokens. Mamba has no block size: nothing is cropped.
"""

from course_lib.gpt.generate import sample
from course_lib.mamba.model import MambaCache


def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, generator=None):
    """Append max_new_tokens sampled ids to idx (B, T); returns (B, T + max_new_tokens)."""
    model.eval()
    new_cache = (lambda: MambaCache(model.config.n_layer)) if use_cache else None
    return sample(lambda ids, cache: model(ids, cache=cache)[0], idx, max_new_tokens, temperature, top_k,
                  generator, None, new_cache)
