"""Chapter 04's checks pass on the reference and reject the usual mistakes."""

import math

import pytest
import torch
from checking import expect_failure

from course_lib.checks import ch04 as check
from course_lib.gpt.tokenizers import merge

# ---- references, written as a learner would ---------------------------------------------

def char_tokenizer(text):
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    return (lambda s: [stoi[c] for c in s]), (lambda ids: "".join(chars[i] for i in ids))


def bpe_merge_step(ids, new_id):
    counts = {}
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + 1
    pair = max(counts, key=counts.get)
    return pair, merge(ids, pair, new_id)


def attention_head(x, w_q, w_k, w_v, scale=True, mask=True, dim=-1):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    scores = q @ k.transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(k.size(-1))
    if mask:
        T = x.size(1)
        scores = scores.masked_fill(torch.ones(T, T).tril() == 0, float("-inf"))
    return torch.softmax(scores, dim=dim) @ v


def split_heads(x, n_head):
    B, T, C = x.shape
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)


def merge_heads(y):
    B, H, T, d = y.shape
    return y.transpose(1, 2).reshape(B, T, H * d)


def block_forward(x, block):
    x = x + block.attn(block.ln_1(x))
    return x + block.mlp(block.ln_2(x))


def top_k_probs(logits, k, temperature):
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return torch.softmax(logits.masked_fill(logits < kth, float("-inf")) / temperature, dim=-1)


def gpt_forward(model, idx, positions=True, offset=0, final_norm=True, head_first=False):
    tr = model.transformer
    x = tr.wte(idx)
    if positions:
        x = x + tr.wpe(torch.arange(offset, offset + idx.size(1)))
    for block in tr.h:
        x = block(x)
    if head_first:
        return tr.ln_f(model.lm_head(x))
    return model.lm_head(tr.ln_f(x) if final_norm else x)


def decode_step(model, token, cache, append=True, causal=False, advance=True):
    tr = model.transformer
    pos = 0 if cache[0] is None or not advance else cache[0][0].size(2)
    x = tr.wte(token) + tr.wpe(torch.tensor([pos]))
    for layer, block in enumerate(tr.h):
        attn = block.attn
        q, k, v = attn.c_attn(block.ln_1(x)).split(x.size(-1), dim=2)
        q, k, v = (split_heads(t, attn.n_head) for t in (q, k, v))
        if cache[layer] is not None and append:
            k = torch.cat([cache[layer][0], k], dim=2)
            v = torch.cat([cache[layer][1], v], dim=2)
        cache[layer] = (k, v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(k.size(-1))
        if causal:      # the mask of a full forward, built for 1 query: only key 0 survives
            Tq, Tk = q.size(-2), k.size(-2)
            scores = scores.masked_fill(torch.ones(Tq, Tk).tril() == 0, float("-inf"))
        x = x + attn.c_proj(merge_heads(torch.softmax(scores, dim=-1) @ v))
        x = x + block.mlp(block.ln_2(x))
    return model.lm_head(tr.ln_f(x))[:, -1]


def train_step(model, optimizer, x, y, grad_clip):
    _, loss = model(x, y)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item()


def test_references_pass(capsys):
    check.char_tokenizer(char_tokenizer)
    check.bpe_merge_step(bpe_merge_step)
    check.attention_head(attention_head)
    check.split_merge_heads(split_heads, merge_heads)
    check.block_forward(block_forward)
    check.top_k_probs(top_k_probs)
    check.train_step(train_step)
    check.gpt_forward(gpt_forward)
    check.decode_step(decode_step)
    assert capsys.readouterr().out.count("passed") == 9


def test_stubs_are_not_implemented():
    def stub(*args):
        raise NotImplementedError
    for c, n in [(check.char_tokenizer, 1), (check.bpe_merge_step, 1), (check.attention_head, 1),
                 (check.split_merge_heads, 2), (check.block_forward, 1), (check.top_k_probs, 1),
                 (check.train_step, 1), (check.gpt_forward, 1), (check.decode_step, 1)]:
        expect_failure(c, *[stub] * n, match="not implemented yet")


# ---- the usual mistakes ----------------------------------------------------------------------

def first_seen_order(text):
    chars = list(dict.fromkeys(text))
    return (lambda s: [chars.index(c) for c in s]), (lambda ids: "".join(chars[i] for i in ids))


def from_one(text):
    chars = sorted(set(text))
    return (lambda s: [chars.index(c) + 1 for c in s]), (lambda ids: "".join(chars[i - 1] for i in ids))


def spaced_decode(text):
    enc, dec = char_tokenizer(text)
    return enc, (lambda ids: " ".join(dec([i]) for i in ids))


@pytest.mark.parametrize("wrong, hint", [(first_seen_order, "sorted characters"), (from_one, "start at 1"),
                                         (spaced_decode, "decode(")])
def test_char_tokenizer_rejects(wrong, hint):
    expect_failure(check.char_tokenizer, wrong, match=hint)


def no_skip(ids, new_id):
    pair, _ = bpe_merge_step(ids, new_id)
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)      # forgot to skip the second id of the pair
        else:
            out.append(ids[i])
        i += 1
    return pair, out


def last_tie(ids, new_id):
    counts = {}
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + 1
    best = max(counts.values())
    pair = [p for p in counts if counts[p] == best][-1]
    return pair, merge(ids, pair, new_id)


def right_to_left(ids, new_id):
    pair, _ = bpe_merge_step(ids, new_id)
    return pair, merge(ids[::-1], pair[::-1], new_id)[::-1]


def even_only(ids, new_id):
    pair, _ = bpe_merge_step(ids, new_id)
    out = []
    for i in range(0, len(ids), 2):            # looks at (0, 1), (2, 3), ... only
        chunk = ids[i:i + 2]
        out += [new_id] if tuple(chunk) == pair else chunk
    return pair, out


@pytest.mark.parametrize("wrong, hint", [(no_skip, "step past both"), (last_tie, "on a tie"),
                                         (right_to_left, "left to right"),
                                         (even_only, "even positions")])
def test_bpe_merge_step_rejects(wrong, hint):
    expect_failure(check.bpe_merge_step, wrong, match=hint)


@pytest.mark.parametrize("kw, hint", [(dict(mask=False), "no causal mask"), (dict(scale=False), "missing scale"),
                                      (dict(dim=-2), "wrong axis")])
def test_attention_head_rejects(kw, hint):
    expect_failure(check.attention_head, lambda *a: attention_head(*a, **kw), match=hint)


def test_attention_head_rejects_dividing_by_d():
    def by_d(x, w_q, w_k, w_v):
        return attention_head(x, w_q / w_q.size(1) ** 0.25, w_k / w_k.size(1) ** 0.25, w_v)
    expect_failure(check.attention_head, by_d, match="square root")


def straight_split(x, n_head):
    B, T, C = x.shape
    return x.reshape(B, n_head, T, C // n_head)


def straight_merge(y):
    B, H, T, d = y.shape
    return y.reshape(B, T, H * d)


@pytest.mark.parametrize("split, merge_, hint", [(straight_split, merge_heads, "mixes positions into heads"),
                                                 (split_heads, straight_merge, "mixes positions into channels")])
def test_split_merge_heads_rejects(split, merge_, hint):
    expect_failure(check.split_merge_heads, split, merge_, match=hint)


def post_norm(x, block):
    x = block.ln_1(x + block.attn(x))
    return block.ln_2(x + block.mlp(x))


def no_residual(x, block):
    return block.mlp(block.ln_2(block.attn(block.ln_1(x))))


def parallel(x, block):
    return x + block.attn(block.ln_1(x)) + block.mlp(block.ln_2(x))


@pytest.mark.parametrize("wrong, hint", [(post_norm, "post-norm"), (no_residual, "residual connections"),
                                         (parallel, "output of the attention")])
def test_block_forward_rejects(wrong, hint):
    expect_failure(check.block_forward, wrong, match=hint)


def keeps_k_plus_one(logits, k, temperature):
    return top_k_probs(logits, min(k + 1, logits.size(-1)), temperature)


def multiplies_temperature(logits, k, temperature):
    return top_k_probs(logits, k, 1 / temperature)


def no_renormalize(logits, k, temperature):
    p = torch.softmax(logits / temperature, -1)
    return p.masked_fill(logits < torch.topk(logits, k, -1).values[..., -1:], 0.0)


@pytest.mark.parametrize("wrong, hint", [(keeps_k_plus_one, "k + 1"), (multiplies_temperature, "multiplied"),
                                         (no_renormalize, "sum to 1")])
def test_top_k_probs_rejects(wrong, hint):
    expect_failure(check.top_k_probs, wrong, match=hint)


def no_clip(model, optimizer, x, y, grad_clip):
    return train_step(model, optimizer, x, y, grad_clip=float("inf"))


def no_zero_grad(model, optimizer, x, y, grad_clip):
    _, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item()


def returns_tensor(model, optimizer, x, y, grad_clip):
    train_step(model, optimizer, x, y, grad_clip)
    return torch.tensor(0.0)


@pytest.mark.parametrize("wrong, hint", [(no_clip, "no clipping"), (no_zero_grad, "piled up"),
                                         (returns_tensor, "Python float")])
def test_train_step_rejects(wrong, hint):
    expect_failure(check.train_step, wrong, match=hint)


@pytest.mark.parametrize("kw, hint", [(dict(positions=False), "position embeddings are missing"),
                                      (dict(final_norm=False), "final LayerNorm is missing"),
                                      (dict(head_first=True), "apply it before the LM head"),
                                      (dict(offset=1), "off by one")])
def test_gpt_forward_rejects(kw, hint):
    expect_failure(check.gpt_forward, lambda model, idx: gpt_forward(model, idx, **kw), match=hint)


def test_gpt_forward_rejects_calling_the_model():
    expect_failure(check.gpt_forward, lambda model, idx: model(idx)[0], match="your code called model(idx)")


@pytest.mark.parametrize("kw, hint", [(dict(append=False), "append this step's k and v"),
                                      (dict(causal=True), "attends only to the first position"),
                                      (dict(advance=False), "position index does not advance")])
def test_decode_step_rejects(kw, hint):
    expect_failure(check.decode_step, lambda model, token, cache: decode_step(model, token, cache, **kw), match=hint)


def test_decode_step_rejects_recomputing_without_the_cache():
    def rerun(model, token, cache):
        cache[0] = token if cache[0] is None else torch.cat([cache[0], token], dim=1)
        return model(cache[0])[0][:, -1]
    expect_failure(check.decode_step, rerun, match="your code called model(...)")


def test_decode_step_rejects_a_cache_of_the_wrong_layout():
    def time_first(model, token, cache):
        logits = decode_step(model, token, cache)
        cache[:] = [(k.transpose(1, 2), v.transpose(1, 2)) for k, v in cache]   # (B, T, H, d): not as asked
        return logits
    expect_failure(check.decode_step, time_first, match="(batch, heads, positions so far, head size)")
