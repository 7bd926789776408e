"""The course's answer to exercise 12.14 (`generate`): read it once your check passes."""

import numpy as np

from course_lib.tensor import no_grad


def generate(model, idx, max_new_tokens, temperature, top_k, draw):
    """The course's answer to exercise 12.14 (`generate`): read it once your check passes.

    Each new token: the model on the last block_size ids (no graph, eval mode), the last position's logits
    divided by the temperature, all but the top_k largest set to -inf, a softmax, and draw(probabilities)
    picks one id per row. Returns idx (B, T) with max_new_tokens ids appended."""
    model.eval()
    idx = np.asarray(idx, dtype=np.int64)
    with no_grad():
        for _ in range(max_new_tokens):
            logits, _ = model(idx[:, -model.config.block_size:])
            last = logits.numpy()[:, -1, :] / temperature
            if top_k is not None and top_k < last.shape[-1]:
                kth = np.sort(last, axis=-1)[:, -top_k, None]
                last = np.where(last < kth, -np.inf, last)
            probs = np.exp(last - last.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            idx = np.concatenate([idx, np.asarray(draw(probs), dtype=np.int64).reshape(-1, 1)], axis=1)
    return idx
