"""Attention as ONNX defines it (opsets 23 to 25), and rotary position embeddings.

The Attention op is the GPT's attention block in one node: q k^T scaled, an optional soft cap,
a bias made of the mask, the causal frontier and a sliding window, the softmax, then the
product with v. It also carries a KV cache (past_key / past_value in, present_key /
present_value out) and grouped heads (several query heads share one key/value head).
"""

import numpy as np

from ..registry import register

_PRECISION = {1: np.float32, 10: np.float16, 11: np.float64}   # softmax_precision: ONNX type -> numpy


def _heads(x, n_heads):
    """(B, S, H * d) -> (B, H, S, d); 4-D inputs are already split into heads."""
    if x.ndim == 4:
        return x
    if not n_heads:
        raise ValueError("3-D Q, K, V need q_num_heads and kv_num_heads")
    B, S, hidden = x.shape
    return x.reshape(B, S, n_heads, hidden // n_heads).transpose(0, 2, 1, 3)


def _allowed(B, Sq, Sk, offset, is_causal, left, right, nonpad):
    """Boolean (B, 1, Sq, Sk): which keys each query may see, before the mask input.

    Query i sits at absolute position p = offset + i (offset per batch entry). Causal: keys j <= p.
    A window keeps p - left <= j <= p + right (a negative bound is no bound). nonpad: keys j < nonpad."""
    p = offset[:, None, None, None] + np.arange(Sq)[None, None, :, None]     # (B, 1, Sq, 1)
    j = np.arange(Sk)[None, None, None, :]
    ok = np.ones((B, 1, Sq, Sk), bool)
    if is_causal:
        ok &= j <= p
    if left >= 0:
        ok &= j >= p - left
    if right >= 0:
        ok &= j <= p + right
    if nonpad is not None:
        ok &= j < nonpad.reshape(B, 1, 1, 1)
    return ok


def attention(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *, is_causal=0,
              kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0,
              softmax_precision=None, left_window_size=-1, right_window_size=-1, _n_outputs=1):
    three_d = Q.ndim == 3
    q, k, v = _heads(Q, q_num_heads), _heads(K, kv_num_heads), _heads(V, kv_num_heads)
    if (past_key is None) != (past_value is None):
        raise ValueError("past_key and past_value go together")
    past = 0 if past_key is None else past_key.shape[2]
    if past_key is not None:
        k, v = np.concatenate([past_key, k], axis=2), np.concatenate([past_value, v], axis=2)
    present_k, present_v = k, v
    B, Hq, Sq, d = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    if Hq != Hkv:                      # grouped heads: query head h reads key/value head h // (Hq / Hkv)
        k, v = np.repeat(k, Hq // Hkv, axis=1), np.repeat(v, Hq // Hkv, axis=1)
    s = q.dtype.type(np.sqrt(scale if scale is not None else 1 / np.sqrt(d)))
    scores = (q * s) @ np.swapaxes(k * s, -1, -2)                            # (B, Hq, Sq, Sk)
    raw = scores
    if softcap:
        scores = softcap * np.tanh(scores / scores.dtype.type(softcap))
    capped = scores
    if nonpad_kv_seqlen is not None:
        offset = nonpad_kv_seqlen.astype(np.int64) - Sq
    else:
        offset = np.full(B, past, np.int64)
    ok = _allowed(B, Sq, Sk, offset, is_causal, left_window_size, right_window_size, nonpad_kv_seqlen)
    bias = np.where(ok, 0, -np.inf).astype(scores.dtype)
    if attn_mask is not None:
        m = attn_mask
        if m.shape[-1] < Sk:           # a shorter mask is padded with 'not allowed'
            fill = False if m.dtype == bool else -np.inf
            m = np.concatenate([m, np.full(m.shape[:-1] + (Sk - m.shape[-1],), fill, m.dtype)], axis=-1)
        bias = bias + (np.where(m, 0, -np.inf).astype(scores.dtype) if m.dtype == bool else m.astype(scores.dtype))
    scores = scores + bias
    masked = scores
    work = scores.astype(_PRECISION.get(softmax_precision, scores.dtype), copy=False)
    top = work.max(axis=-1, keepdims=True)
    empty = ~np.isfinite(top) & (top < 0)                    # a row where every key is masked out
    e = np.exp(work - np.where(empty, 0, top))
    total = e.sum(axis=-1, keepdims=True)
    probs = np.where(empty, 0, e / np.where(empty, 1, total)).astype(q.dtype)
    y = probs @ v                                                             # (B, Hq, Sq, dv)
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(B, Sq, -1)
    qk = (raw, capped, masked, probs)[qk_matmul_output_mode]
    return (y, present_k, present_v, qk.astype(q.dtype, copy=False))[:_n_outputs]


@register("Attention", since=23)
def attention_23(Q, K, V, attn_mask=None, past_key=None, past_value=None, *, is_causal=0, kv_num_heads=None,
                 q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0, softmax_precision=None,
                 _n_outputs=1):
    return attention(Q, K, V, attn_mask, past_key, past_value, None, is_causal=is_causal, kv_num_heads=kv_num_heads,
                     q_num_heads=q_num_heads, qk_matmul_output_mode=qk_matmul_output_mode, scale=scale,
                     softcap=softcap, softmax_precision=softmax_precision, _n_outputs=_n_outputs)


@register("Attention", since=24)
def attention_24(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *, is_causal=0,
                 kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0,
                 softmax_precision=None, _n_outputs=1):
    """Opset 24 adds nonpad_kv_seqlen: the valid length of each batch entry of an external cache."""
    return attention(Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen, is_causal=is_causal,
                     kv_num_heads=kv_num_heads, q_num_heads=q_num_heads, qk_matmul_output_mode=qk_matmul_output_mode,
                     scale=scale, softcap=softcap, softmax_precision=softmax_precision, _n_outputs=_n_outputs)


@register("Attention", since=25)
def attention_25(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *, is_causal=0,
                 kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0,
                 softmax_precision=None, left_window_size=-1, right_window_size=-1, _n_outputs=1):
    """Opset 25 adds a sliding window: left_window_size and right_window_size around each query."""
    return attention(Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen, is_causal=is_causal,
                     kv_num_heads=kv_num_heads, q_num_heads=q_num_heads, qk_matmul_output_mode=qk_matmul_output_mode,
                     scale=scale, softcap=softcap, softmax_precision=softmax_precision,
                     left_window_size=left_window_size, right_window_size=right_window_size, _n_outputs=_n_outputs)


@register("RotaryEmbedding", since=23)
def rotary_embedding(x, cos_cache, sin_cache, position_ids=None, *, interleaved=0, num_heads=0,
                     rotary_embedding_dim=0):
    """Rotate pairs of channels of each head by angles that grow with the position (RoPE).

    x: (B, H, S, d) or (B, S, H * d). The first rotary_embedding_dim channels of each head (all by
    default) form pairs, (i, i + half) or, interleaved, (2i, 2i + 1); pair i at position t turns by
    the angle whose cosine and sine are cos_cache[t, i] and sin_cache[t, i]."""
    four_d = x.ndim == 4
    h = x.transpose(0, 2, 1, 3) if four_d else x.reshape(x.shape[0], x.shape[1], num_heads, -1)  # (B, S, H, d)
    d = h.shape[-1]
    rot = rotary_embedding_dim or d
    if position_ids is not None:
        cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]    # (B, S, rot / 2)
    cos, sin = cos_cache[:, :, None, :], sin_cache[:, :, None, :]               # broadcast over heads
    part = h[..., :rot]
    a, b = (part[..., 0::2], part[..., 1::2]) if interleaved else (part[..., :rot // 2], part[..., rot // 2:])
    ra, rb = a * cos - b * sin, a * sin + b * cos
    out = h.copy()
    if interleaved:
        out[..., 0:rot:2], out[..., 1:rot:2] = ra, rb
    else:
        out[..., :rot // 2], out[..., rot // 2:rot] = ra, rb
    out = out.astype(x.dtype, copy=False)
    return out.transpose(0, 2, 1, 3) if four_d else out.reshape(x.shape)


@register("LinearAttention", since=27)
def linear_attention(query, key, value, past_state=None, decay=None, beta=None, *, q_num_heads, kv_num_heads,
                     chunk_size=64, scale=0.0, update_rule="gated_delta"):
    """Attention as a recurrence over a (d_k, d_v) state S per key/value head, one token at a time:

        linear:       S = S + k v^T
        gated:        S = exp(g) S + k v^T
        delta:        S = S + beta k (v - S^T k)^T
        gated_delta:  S = exp(g) S + beta k (v - (exp(g) S)^T k)^T
        output:       o = scale * S^T q      (query head h reads key/value head h // (Hq / Hkv))

    chunk_size is a hint for faster schedules; this reference-style loop does not need it."""
    B, T, _ = query.shape
    work = np.float32 if query.dtype == np.float16 else query.dtype             # float16 runs in float32
    q = query.reshape(B, T, q_num_heads, -1).astype(work)
    k = key.reshape(B, T, kv_num_heads, -1).astype(work)
    v = value.reshape(B, T, kv_num_heads, -1).astype(work)
    dk, dv = k.shape[-1], v.shape[-1]
    scale = scale or 1 / np.sqrt(dk)
    S = np.zeros((B, kv_num_heads, dk, dv), work) if past_state is None else past_state.astype(work)
    group = q_num_heads // kv_num_heads
    out = np.empty((B, T, q_num_heads, dv), work)
    for t in range(T):
        kt, vt = k[:, t, :, :, None], v[:, t, :, None, :]               # (B, Hkv, dk, 1), (B, Hkv, 1, dv)
        if update_rule in ("gated", "gated_delta"):
            g = decay[:, t].reshape(B, kv_num_heads, -1)[..., None].astype(work)   # (B, Hkv, dk or 1, 1)
            S = np.exp(g) * S
        if update_rule in ("delta", "gated_delta"):
            b = np.broadcast_to(beta[:, t].reshape(B, -1), (B, kv_num_heads))[:, :, None, None].astype(work)
            recalled = (S * kt).sum(axis=2, keepdims=True)               # S^T k: (B, Hkv, 1, dv)
            S = S + b * kt * (vt - recalled)
        elif update_rule in ("linear", "gated"):
            S = S + kt * vt
        else:
            raise ValueError(f"LinearAttention's update_rule {update_rule!r}")
        Sq = np.repeat(S, group, axis=1)                                 # (B, Hq, dk, dv)
        out[:, t] = scale * (Sq * q[:, t, :, :, None]).sum(axis=2)
    return out.reshape(B, T, -1).astype(query.dtype), S.astype(query.dtype)
