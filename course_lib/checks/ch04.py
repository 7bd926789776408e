"""Checks for chapter 04, a GPT from scratch: tokenizers, attention, the block, sampling, training."""

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F

from course_lib.checks import assert_close, assert_equal, exercise, fmt, require, rng


def _torch_rng():
    return torch.Generator().manual_seed(int(rng().integers(2**31)))


def _randn(*shape, g):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


# ---- tokenizers ---------------------------------------------------------------------------

_ALPHABET = list("abcdefghij ,.!\nXYZ") + ["é", "ß", "λ", "→", "日", "😀"]


def _random_text(n):
    letters = rng().choice(_ALPHABET, size=int(rng().integers(5, len(_ALPHABET))), replace=False)
    return "".join(rng().choice(letters, size=n))


@exercise
def char_tokenizer(char_tokenizer):
    """char_tokenizer(text) -> (encode, decode): ids numbered by the sorted distinct characters."""
    for n in (int(rng().integers(20, 60)), int(rng().integers(60, 200))):
        text = _random_text(n)
        encode, decode = char_tokenizer(text)
        chars = sorted(set(text))
        s = "".join(rng().choice(list(text), size=int(rng().integers(5, 15))))
        ids = encode(s)
        require(isinstance(ids, (list, tuple)) or hasattr(ids, "tolist"),
                f"encode should return a list of ints, got {type(ids).__name__}.")
        ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        expected = [chars.index(c) for c in s]
        first_seen = list(dict.fromkeys(text))
        hint = None
        if ids == [first_seen.index(c) for c in s]:
            hint = "your ids follow the order in which characters first appear; number them in sorted order: sorted(set(text))."
        elif ids == [i + 1 for i in expected]:
            hint = "your ids start at 1; the first character gets id 0."
        assert_equal(ids, expected, what=f"encode({s!r})", inputs={"text": text}, hint=hint)
        back = decode(expected)
        assert_equal(back, s, what=f"decode({expected})", inputs={"text": text},
                     hint="decode maps each id back to its character and joins them into one string.")
    return "2 random texts with non-ASCII characters"


def _merge_reference(ids, new_id):
    counts = {}
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + 1
    pair = max(counts, key=counts.get)
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return pair, out


def _merge_cases():
    """Random sequences over a few ids, with runs like 7 7 7 (overlaps) and ties between pairs."""
    cases = [[3, 3, 3, 1, 3, 3, 3, 3, 2],     # (3, 3) wins; runs of 3 and 4 test non-overlap
             [5, 6, 1, 2, 5, 6, 1, 2, 9]]     # (5, 6), (6, 1), (1, 2) tie 2-2-2: the first counted wins
    for _ in range(4):
        alphabet = rng().choice(np.arange(2, 40), size=int(rng().integers(2, 5)), replace=False)
        cases.append([int(v) for v in rng().choice(alphabet, size=int(rng().integers(9, 40)))])
    return cases


@exercise
def bpe_merge_step(bpe_merge_step):
    """bpe_merge_step(ids, new_id) -> (pair, merged ids): the most frequent pair, merged left to right."""
    for ids in _merge_cases():
        new_id = 256 + int(rng().integers(0, 50))
        pair, expected = _merge_reference(ids, new_id)
        result = bpe_merge_step(list(ids), new_id)
        require(isinstance(result, tuple) and len(result) == 2,
                f"bpe_merge_step should return (pair, new_ids); got {fmt(result)}.")
        yours_pair, yours = result
        yours_pair = tuple(int(v) for v in yours_pair)
        tie_hint = None
        if yours_pair != pair:
            counts = {}
            for p in zip(ids, ids[1:]):
                counts[p] = counts.get(p, 0) + 1
            if counts.get(yours_pair) == counts[pair]:
                tie_hint = (f"{yours_pair} and {pair} are both seen {counts[pair]} times: on a tie, take the pair "
                            "counted first (max over a dict filled in sequence order does this).")
        assert_equal(yours_pair, pair, what="the pair to merge", inputs={"ids": ids}, hint=tie_hint)
        yours = [int(v) for v in yours]
        hint = None
        if len(yours) != len(expected):
            hint = ("after a merge, step past both ids of the pair (i += 2): pairs must not overlap, "
                    "so 7 7 7 becomes [new, 7], and every other id is kept once.")
        elif yours == _merge_reference(ids[::-1], new_id)[1][::-1]:
            hint = "merge from left to right: in 7 7 7 the first two merge."
        assert_equal(yours, expected, what=f"the ids after merging {pair} into {new_id}", inputs={"ids": ids},
                     hint=hint or "walk i from left to right: if ids[i], ids[i+1] is the pair, emit new_id and step 2.")
    return "6 sequences, with ties and runs"


# ---- attention ----------------------------------------------------------------------------

def _head_oracle(x, wq, wk, wv, scale=True, mask=True, dim=-1):
    q, k, v = x @ wq, x @ wk, x @ wv
    s = q @ k.transpose(-2, -1)
    if scale:
        s = s / math.sqrt(q.size(-1))
    if mask:
        T = x.size(-2)
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    return torch.softmax(s, dim=dim).nan_to_num(0.0) @ v


@exercise
def attention_head(attention_head):
    """attention_head(x, w_q, w_k, w_v): one causal self-attention head, against PyTorch's SDPA in float64."""
    g = _torch_rng()
    for B, T, C, hs in [(2, 7, 12, 5), (3, int(rng().integers(9, 14)), 10, 8), (1, 1, 6, 3)]:
        x, wq, wk, wv = _randn(B, T, C, g=g), _randn(C, hs, g=g), _randn(C, hs, g=g), _randn(C, hs, g=g)
        yours = attention_head(x.clone(), wq, wk, wv)
        expected = F.scaled_dot_product_attention(x @ wq, x @ wk, x @ wv, is_causal=True)
        assert_close(yours, expected, what=f"the head's output for x of shape {(B, T, C)}, head size {hs}",
                     rtol=1e-7, atol=1e-9,
                     mistakes={
                         "no causal mask: position t must not see positions after t (masked_fill the upper "
                         "triangle with -inf before the softmax)": _head_oracle(x, wq, wk, wv, mask=False),
                         "missing scale: divide the scores q @ k^T by sqrt(head_size) before the softmax":
                             _head_oracle(x, wq, wk, wv, scale=False),
                         "softmax over the wrong axis: normalize over the keys, the last axis (dim=-1)":
                             _head_oracle(x, wq, wk, wv, dim=-2),
                         "you divided by head_size; divide by its square root":
                             _head_oracle(x, wq / math.sqrt(math.sqrt(hs)), wk / math.sqrt(math.sqrt(hs)), wv),
                     })
    return "3 shapes, against scaled_dot_product_attention"


@exercise
def split_merge_heads(split_heads, merge_heads):
    """split_heads: (B, T, C) -> (B, H, T, C/H), head h holding channels h*d:(h+1)*d; merge_heads undoes it."""
    g = _torch_rng()
    for B, T, H, d in [(2, 5, 3, 4), (1, int(rng().integers(6, 11)), 4, 3)]:
        x = _randn(B, T, H * d, g=g)
        expected = torch.stack([x[:, :, h * d:(h + 1) * d] for h in range(H)], dim=1)
        yours = split_heads(x, H)
        assert_close(yours, expected, what=f"split_heads(x of shape {(B, T, H * d)}, n_head={H})",
                     mistakes={"you reshaped straight to (B, H, T, d): view as (B, T, H, d) first, then transpose(1, 2)":
                               x.reshape(B, H, T, d)})
        back = merge_heads(expected)
        assert_close(back, x, what=f"merge_heads(y of shape {(B, H, T, d)})",
                     mistakes={"you reshaped straight to (B, T, C): transpose(1, 2) back to (B, T, H, d) first":
                               expected.reshape(B, T, H * d)})
    return "2 shapes, both directions"


def _random_block(C, H, g):
    from course_lib.gpt.model import Block, GPTConfig

    block = Block(GPTConfig(n_embd=C, n_head=H, dropout=0.0)).double().eval()
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(0.4 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    return block


@exercise
def block_forward(block_forward):
    """block_forward(x, block): x + attn(ln_1(x)), then x + mlp(ln_2(x)), with the block's own modules."""
    g = _torch_rng()
    for B, T, C, H in [(2, 7, 12, 3), (1, int(rng().integers(5, 12)), 8, 2)]:
        block = _random_block(C, H, g)
        x = _randn(B, T, C, g=g)
        with torch.no_grad():
            yours = block_forward(x.clone(), block)
            a = x + block.attn(block.ln_1(x))
            expected = a + block.mlp(block.ln_2(a))
            post = block.ln_1(x + block.attn(x))
            post = block.ln_2(post + block.mlp(post))
            no_res = block.mlp(block.ln_2(block.attn(block.ln_1(x))))
            one_ln = x + block.attn(block.ln_1(x))
            one_ln = one_ln + block.mlp(block.ln_1(one_ln))
            norm_res = block.ln_1(x) + block.attn(block.ln_1(x))
            norm_res = block.ln_2(norm_res) + block.mlp(block.ln_2(norm_res))
            parallel = x + block.attn(block.ln_1(x)) + block.mlp(block.ln_2(x))
        assert_close(yours, expected, what=f"the block's output for x of shape {(B, T, C)}", rtol=1e-7, atol=1e-9,
                     mistakes={"that is post-norm (LayerNorm after the residual add); GPT-2 normalizes first: "
                               "x = x + attn(ln_1(x))": post,
                               "the residual connections are missing: add each sublayer's output to x": no_res,
                               "use ln_2 before the MLP; ln_1 belongs to attention": one_ln,
                               "the residual must carry x itself, not the normalized ln(x)": norm_res,
                               "the MLP must see the output of the attention step, not the block's input": parallel})
    return "2 random blocks in float64"


# ---- sampling -----------------------------------------------------------------------------

@exercise
def top_k_probs(top_k_probs):
    """top_k_probs(logits, k, temperature): softmax of logits / temperature over the k largest, 0 elsewhere."""
    g = _torch_rng()
    for B, V, k, temp in [(2, 11, 3, 0.7), (3, 17, 1, 1.3), (1, 9, int(rng().integers(2, 8)), 1.0)]:
        logits = _randn(B, V, g=g) * 2

        def ref(k=k, t=temp, largest=True):
            kth = torch.topk(logits, k, dim=-1, largest=largest).values[..., -1:]
            keep = logits >= kth if largest else logits <= kth
            return torch.softmax(logits.masked_fill(~keep, float("-inf")) / t, -1)

        yours = top_k_probs(logits.clone(), k, temp)
        expected = ref()
        plain = torch.softmax(logits / temp, -1)
        mistakes = {"you keep k + 1 tokens: keep logits >= the k-th largest (topk(...).values[..., -1:])"
                    : ref(k=min(k + 1, V)),
                    "you multiplied by the temperature: divide the logits by it, before the softmax": ref(t=1 / temp),
                    "you kept the k smallest logits; keep the k largest": ref(largest=False),
                    "the probabilities outside the top k must be 0: set those logits to -inf before the softmax":
                        plain,
                    "after zeroing, the kept probabilities must sum to 1: mask the logits, then softmax":
                        plain.masked_fill(logits < torch.topk(logits, k, -1).values[..., -1:], 0.0)}
        if temp == 1.0:
            mistakes = {h: w for h, w in mistakes.items() if "temperature" not in h}
        assert_close(yours, expected, what=f"the probabilities for k={k}, temperature={temp}", rtol=1e-7, atol=1e-10,
                     inputs={"logits": logits}, mistakes=mistakes)
    return "3 cases of k and temperature"


# ---- training -----------------------------------------------------------------------------

def _tiny_gpt(g):
    from course_lib.gpt.model import GPT, GPTConfig

    torch.manual_seed(int(torch.randint(2**31, (1,), generator=g)))
    return GPT(GPTConfig(vocab_size=19, block_size=9, n_layer=2, n_head=2, n_embd=12)).double()


def _reference_step(model, opt, x, y, clip):
    _, loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss.item()


@exercise
def train_step(train_step):
    """train_step(model, optimizer, x, y, grad_clip): forward, zero grads, backward, clip, step; returns the loss."""
    g = _torch_rng()
    model = _tiny_gpt(g)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)       # big gradients, so the clipping matters
    ref_model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=3e-3, weight_decay=0.1)
    for step in range(3):
        x, y = torch.randint(0, 19, (3, 9), generator=g), torch.randint(0, 19, (3, 9), generator=g)
        clip = 0.5
        # what the usual mistakes would do to the same copy of the model, this step
        wrong = {}
        for name in ("no_clip", "no_zero"):
            m = copy.deepcopy(ref_model)
            o = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.1)
            o.load_state_dict(copy.deepcopy(ref_opt.state_dict()))   # load_state_dict would share tensors
            if name == "no_zero":
                for p, q in zip(m.parameters(), ref_model.parameters()):
                    p.grad = None if q.grad is None else q.grad.clone()
            _, loss = m(x, y)
            if name != "no_zero":
                o.zero_grad()
            loss.backward()
            if name != "no_clip":
                torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
            o.step()
            wrong[name] = torch.cat([p.detach().flatten() for p in m.parameters()])
        loss = train_step(model, opt, x, y, clip)
        ref_loss = _reference_step(ref_model, ref_opt, x, y, clip)
        require(isinstance(loss, float), f"train_step should return the loss as a Python float (loss.item()), "
                f"got {type(loss).__name__}.")
        assert_close(loss, ref_loss, what=f"the loss returned at step {step}", rtol=1e-9,
                     hint="return the loss of the forward pass before the update, as loss.item().")
        yours = torch.cat([p.detach().flatten() for p in model.parameters()])
        expected = torch.cat([p.detach().flatten() for p in ref_model.parameters()])
        assert_close(yours, expected, what=f"the parameters after step {step}", rtol=1e-7, atol=1e-10,
                     mistakes={"the update is as if there were no clipping: call "
                               "torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip) after backward, "
                               "before optimizer.step()": wrong["no_clip"],
                               "gradients piled up across steps: call optimizer.zero_grad() before backward":
                                   wrong["no_zero"]},
                     hint="the order is: loss = model(x, y)[1]; optimizer.zero_grad(); loss.backward(); "
                          "clip_grad_norm_; optimizer.step().")
    return "3 steps of a tiny GPT in float64, with clipping active"
