"""Checks for chapter 04, a GPT from scratch: tokenizers, attention, the block, the forward pass, sampling,
training and a KV-cache decode step."""

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F

from course_lib.checks import CheckFailed, assert_close, assert_equal, exercise, fmt, require, rng


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
def char_tokenizer(your_char_tokenizer):
    """char_tokenizer(text) -> (encode, decode): ids numbered by the sorted distinct characters."""
    for n in (int(rng().integers(20, 60)), int(rng().integers(60, 200))):
        text = _random_text(n)
        encode, decode = your_char_tokenizer(text)
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
            hint = ("your ids follow the order in which characters first appear; the numbering follows the sorted "
                    "characters, so that it does not depend on where a character first appears.")
        elif ids == [i + 1 for i in expected]:
            hint = "your ids start at 1; the first character gets id 0."
        assert_equal(ids, expected, what=f"encode({s!r})", inputs={"text": text}, hint=hint)
        back = decode(expected)
        assert_equal(back, s, what=f"decode({expected})", inputs={"text": text},
                     hint="decode maps each id back to its character and joins them into one string.")
    return "2 random texts with non-ASCII characters"


def _merge_reference(ids, new_id):
    """The oracle: the pair with the highest count, the earliest first seen among equals, then a
    rewrite that skips the id after each merge."""
    seen = {}                                   # pair -> (count, where it first occurs)
    for at, pair in enumerate(zip(ids, ids[1:])):
        count, first = seen.get(pair, (0, at))
        seen[pair] = (count + 1, first)
    best = min(seen, key=lambda pair: (-seen[pair][0], seen[pair][1]))
    merged, skip = [], False
    for at, token in enumerate(ids):
        if skip:
            skip = False
        elif tuple(ids[at:at + 2]) == best:
            merged.append(new_id)
            skip = True
        else:
            merged.append(token)
    return best, merged


def _merge_cases():
    """Random sequences over a few ids, with runs like 7 7 7 (overlaps) and ties between pairs."""
    cases = [[3, 3, 3, 1, 3, 3, 3, 3, 2],     # (3, 3) wins; runs of 3 and 4 test non-overlap
             [5, 6, 1, 2, 5, 6, 1, 2, 9]]     # (5, 6), (6, 1), (1, 2) tie 2-2-2: the first counted wins
    for _ in range(4):
        alphabet = rng().choice(np.arange(2, 40), size=int(rng().integers(2, 5)), replace=False)
        cases.append([int(v) for v in rng().choice(alphabet, size=int(rng().integers(9, 40)))])
    # on every run: the winning pair only at odd positions, and overlapping runs that start at odd positions
    a, b, *fill = (int(v) for v in rng().choice(np.arange(2, 60), size=12, replace=False))
    odd = [fill[0]]
    for j in range(int(rng().integers(3, 5))):
        odd += [a, b, fill[2 * j + 1], fill[2 * j + 2]]       # a lands at 1, 5, 9, ...
    cases.append(odd)
    run1, run2 = int(rng().choice([3, 5])), int(rng().integers(3, 6))
    cases.append([fill[0]] + [a] * run1 + [fill[1]] + [a] * run2 + [fill[2]])
    return cases


def _even_only(ids, pair, new_id):
    """The mistake of looking at the pairs (0, 1), (2, 3), ... only."""
    out = []
    for i in range(0, len(ids), 2):
        chunk = ids[i:i + 2]
        out += [new_id] if tuple(chunk) == pair else chunk
    return out


@exercise
def bpe_merge_step(your_bpe_merge_step):
    """bpe_merge_step(ids, new_id) -> (pair, merged ids): the most frequent pair, merged left to right."""
    for ids in _merge_cases():
        new_id = 256 + int(rng().integers(0, 50))
        pair, expected = _merge_reference(ids, new_id)
        result = your_bpe_merge_step(list(ids), new_id)
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
        if yours == _even_only(ids, pair, new_id) and yours != expected:
            hint = ("you only merged pairs that start at even positions: a pair can start anywhere, so step "
                    "by one when there is no match and by two after a merge.")
        elif len(yours) != len(expected):
            hint = ("after a merge, step past both ids of the pair (i += 2): pairs must not overlap, "
                    "so 7 7 7 becomes [new, 7], and every other id is kept once.")
        elif yours == _merge_reference(ids[::-1], new_id)[1][::-1]:
            hint = "merge from left to right: in 7 7 7 the first two merge."
        assert_equal(yours, expected, what=f"the ids after merging {pair} into {new_id}", inputs={"ids": ids},
                     hint=hint or "walk i from left to right: if ids[i], ids[i+1] is the pair, emit new_id and step 2.")
    return "8 sequences, with ties, runs and pairs at odd positions"


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
def attention_head(your_attention_head):
    """attention_head(x, w_q, w_k, w_v): one causal self-attention head, against PyTorch's SDPA in float64."""
    g = _torch_rng()
    for B, T, C, hs in [(2, 7, 12, 5), (3, int(rng().integers(9, 14)), 10, 8), (1, 1, 6, 3)]:
        x, wq, wk, wv = _randn(B, T, C, g=g), _randn(C, hs, g=g), _randn(C, hs, g=g), _randn(C, hs, g=g)
        yours = your_attention_head(x.clone(), wq, wk, wv)
        expected = F.scaled_dot_product_attention(x @ wq, x @ wk, x @ wv, is_causal=True)
        assert_close(yours, expected, what=f"the head's output for x of shape {(B, T, C)}, head size {hs}",
                     rtol=1e-7, atol=1e-9,
                     mistakes={
                         "no causal mask: position t must not see positions after t": _head_oracle(x, wq, wk, wv, mask=False),
                         "missing scale: the scores are divided by the square root of the head size":
                             _head_oracle(x, wq, wk, wv, scale=False),
                         "softmax over the wrong axis: each query's weights over the keys sum to 1":
                             _head_oracle(x, wq, wk, wv, dim=-2),
                         "you divided by head_size; divide by its square root":
                             _head_oracle(x, wq / math.sqrt(math.sqrt(hs)), wk / math.sqrt(math.sqrt(hs)), wv),
                     })
    return "3 shapes, against scaled_dot_product_attention"


@exercise
def split_merge_heads(your_split_heads, your_merge_heads):
    """split_heads: (B, T, C) -> (B, H, T, C/H), head h holding channels h*d:(h+1)*d; merge_heads undoes it."""
    g = _torch_rng()
    for B, T, H, d in [(2, 5, 3, 4), (1, int(rng().integers(6, 11)), 4, 3)]:
        x = _randn(B, T, H * d, g=g)
        expected = torch.stack([x[:, :, h * d:(h + 1) * d] for h in range(H)], dim=1)
        yours = your_split_heads(x, H)
        assert_close(yours, expected, what=f"split_heads(x of shape {(B, T, H * d)}, n_head={H})",
                     mistakes={"you reshaped straight to (B, H, T, d), which mixes positions into heads: a head's channels are "
                               "consecutive within each position":
                               x.reshape(B, H, T, d)})
        back = your_merge_heads(expected)
        assert_close(back, x, what=f"merge_heads(y of shape {(B, H, T, d)})",
                     mistakes={"you reshaped straight to (B, T, C), which mixes positions into channels: merging undoes the "
                               "split's moves in reverse":
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
def block_forward(your_block_forward):
    """block_forward(x, block): x + attn(ln_1(x)), then x + mlp(ln_2(x)), with the block's own modules."""
    g = _torch_rng()
    for B, T, C, H in [(2, 7, 12, 3), (1, int(rng().integers(5, 12)), 8, 2)]:
        block = _random_block(C, H, g)
        x = _randn(B, T, C, g=g)
        with torch.no_grad():
            yours = your_block_forward(x.clone(), block)
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
                     mistakes={"that is post-norm (LayerNorm after the residual add); GPT-2 normalizes what enters "
                               "each sublayer and adds the result to the untouched stream": post,
                               "the residual connections are missing: each sublayer's output is added to the stream": no_res,
                               "each sublayer has its own LayerNorm": one_ln,
                               "the residual must carry x itself, not the normalized ln(x)": norm_res,
                               "the MLP must see the output of the attention step, not the block's input": parallel})
    return "2 random blocks in float64"


# ---- sampling -----------------------------------------------------------------------------

@exercise
def top_k_probs(your_top_k_probs):
    """top_k_probs(logits, k, temperature): softmax of logits / temperature over the k largest, 0 elsewhere."""
    g = _torch_rng()
    for B, V, k, temp in [(2, 11, 3, 0.7), (3, 17, 1, 1.3), (1, 9, int(rng().integers(2, 8)), 1.0)]:
        logits = _randn(B, V, g=g) * 2

        def ref(k=k, t=temp, largest=True):
            kth = torch.topk(logits, k, dim=-1, largest=largest).values[..., -1:]
            keep = logits >= kth if largest else logits <= kth
            return torch.softmax(logits.masked_fill(~keep, float("-inf")) / t, -1)

        yours = your_top_k_probs(logits.clone(), k, temp)
        expected = ref()
        plain = torch.softmax(logits / temp, -1)
        mistakes = {"you keep k + 1 tokens: the k-th largest logit itself is the last one kept"
                    : ref(k=min(k + 1, V)),
                    "you multiplied by the temperature; a temperature above 1 flattens the distribution": ref(t=1 / temp),
                    "you kept the k smallest logits; keep the k largest": ref(largest=False),
                    "the probabilities outside the top k must be exactly 0":
                        plain,
                    "after the others are discarded, the kept probabilities must sum to 1":
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
    """The oracle: this batch's gradients by torch.autograd.grad, scaled by hand to a global norm of at
    most `clip` (torch's factor, clip / (norm + 1e-6)), handed to the optimizer."""
    params = [p for p in model.parameters() if p.requires_grad]
    _, loss = model(x, y)
    grads = torch.autograd.grad(loss, params)
    norm = torch.sqrt(sum((gr * gr).sum() for gr in grads))
    scale = min(1.0, float(clip / (norm + 1e-6)))
    for p, gr in zip(params, grads):
        p.grad = gr * scale
    opt.step()
    return float(loss.detach())


@exercise
def train_step(your_train_step):
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
        loss = your_train_step(model, opt, x, y, clip)
        ref_loss = _reference_step(ref_model, ref_opt, x, y, clip)
        require(isinstance(loss, float), f"train_step should return the loss as a Python float, "
                f"got {type(loss).__name__}.")
        assert_close(loss, ref_loss, what=f"the loss returned at step {step}", rtol=1e-9,
                     hint="return this batch's loss from before the update, as a Python number.")
        yours = torch.cat([p.detach().flatten() for p in model.parameters()])
        expected = torch.cat([p.detach().flatten() for p in ref_model.parameters()])
        assert_close(yours, expected, what=f"the parameters after step {step}", rtol=1e-7, atol=1e-10,
                     mistakes={"the update is as if there were no clipping: the update must see the gradients "
                               "after their global norm is clipped to grad_clip": wrong["no_clip"],
                               "gradients piled up across steps: backward adds into whatever the gradients hold":
                                   wrong["no_zero"]},
                     hint="each action of the step needs the one before it complete: the gradients of this "
                          "batch alone, clipped, then the update.")
    return "3 steps of a tiny GPT in float64, with clipping active"


# ---- the whole model ------------------------------------------------------------------------

def _random_gpt(g, vocab_size=19, block_size=11, n_layer=2, n_head=3, n_embd=12, scale=0.3):
    """A tiny GPT in float64 whose every weight is random (not GPT-2's small init), so that a
    missing position embedding or LayerNorm changes the logits by a lot, not by 1e-3."""
    from course_lib.gpt.model import GPT, GPTConfig

    config = GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head,
                       n_embd=n_embd, dropout=0.0)
    model = GPT(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(scale * torch.randn(p.shape, generator=g, dtype=torch.float64))
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                p.add_(1.0)     # LayerNorm gains near 1, as after training, but not exactly 1
    return model


def _reference_copy(model):
    """A copy of the GPT with the same weights, whose forward the learner's code does not replace."""
    return copy.deepcopy(model).eval()


def _functional_logits(model, idx):
    """The oracle of the whole GPT: its weights through torch.nn.functional, block by block (GPT-2's
    pre-norm block, causal attention by SDPA, a GELU MLP), without the modules' own forwards."""
    tr, config = model.transformer, model.config
    n_head, C = config.n_head, config.n_embd
    B, T = idx.shape
    h = tr.wte.weight[idx] + tr.wpe.weight[:T]
    for block in tr.h:
        a = F.layer_norm(h, (C,), block.ln_1.weight, block.ln_1.bias)
        q, k, v = F.linear(a, block.attn.c_attn.weight, block.attn.c_attn.bias).chunk(3, dim=-1)
        q, k, v = (z.reshape(B, T, n_head, C // n_head).permute(0, 2, 1, 3) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).permute(0, 2, 1, 3).reshape(B, T, C)
        h = h + F.linear(y, block.attn.c_proj.weight, block.attn.c_proj.bias)
        m = F.layer_norm(h, (C,), block.ln_2.weight, block.ln_2.bias)
        m = F.gelu(F.linear(m, block.mlp.c_fc.weight, block.mlp.c_fc.bias), approximate=config.gelu)
        h = h + F.linear(m, block.mlp.c_proj.weight, block.mlp.c_proj.bias)
    h = F.layer_norm(h, (C,), tr.ln_f.weight, tr.ln_f.bias)
    return F.linear(h, model.lm_head.weight)


def _forbid(module, what, instead):
    """Replace module's forward so that calling it fails with a message that says what to use."""
    def forward(*args, **kwargs):
        raise CheckFailed(f"your code called {what}, which is the thing this exercise writes: {instead}")
    module.forward = forward


def _gpt_variant(model, idx, positions=True, offset=0, final_norm=True):
    tr = model.transformer
    T = idx.size(1)
    x = tr.wte(idx)
    if positions:
        x = x + tr.wpe(torch.arange(offset, offset + T))
    for block in tr.h:
        x = block(x)
    return model.lm_head(tr.ln_f(x) if final_norm else x)


@exercise
def gpt_forward(your_gpt_forward):
    """gpt_forward(model, idx): the logits of a GPT, built from its modules, against the reference GPT in float64."""
    g = _torch_rng()
    model = _random_gpt(g)
    ref = _reference_copy(model)
    V, block_size = model.config.vocab_size, model.config.block_size
    _forbid(model, "model(idx)", "build the logits from model.transformer.wte, .wpe, .h, .ln_f and model.lm_head.")
    cases = [(2, int(rng().integers(5, block_size - 1))), (3, 1), (1, block_size)]
    for B, T in cases:
        idx = torch.randint(0, V, (B, T), generator=g)
        with torch.no_grad():
            expected = _functional_logits(ref, idx)
            mistakes = {
                "the position embeddings are missing: each token's embedding also says where it stands":
                    _gpt_variant(ref, idx, positions=False),
                "the final LayerNorm is missing, between the last block and the LM head":
                    _gpt_variant(ref, idx, final_norm=False),
            }
            if T < block_size:
                mistakes["your positions are off by one: the first token has position 0"] = _gpt_variant(ref, idx, offset=1)
            try:
                yours = your_gpt_forward(model, idx.clone())
            except RuntimeError as e:
                if "normalized_shape" in str(e):
                    raise CheckFailed(
                        f"your code raised RuntimeError: {e}\n  hint: ln_f normalizes the n_embd channels of the "
                        "residual stream; apply it before the LM head, which maps n_embd channels to vocab_size "
                        "logits.") from None
                raise
        assert_close(yours, expected, what=f"the output for idx of shape {(B, T)}", rtol=1e-9, atol=1e-10,
                     inputs={"idx": idx}, mistakes=mistakes)
    return "3 batches of a random 2-layer GPT in float64, against its weights run through torch.nn.functional"


# ---- the KV cache ---------------------------------------------------------------------------

def _decode_variant(model, token, cache, mode="right"):
    """One decode step of the reference, or of a usual mistake (mode), with its own cache list."""
    tr = model.transformer
    pos = 0 if cache[0] is None or mode == "stuck" else cache[0][0].size(2)
    x = tr.wte(token) + tr.wpe(torch.tensor([pos]))
    for layer, block in enumerate(tr.h):
        attn = block.attn
        B, T, C = x.shape
        H = attn.n_head
        q, k, v = attn.c_attn(block.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        if cache[layer] is not None and mode != "no_append":
            k, v = torch.cat([cache[layer][0], k], dim=2), torch.cat([cache[layer][1], v], dim=2)
        cache[layer] = (k, v)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=(mode == "causal_one"))
        x = x + attn.c_proj(y.transpose(1, 2).reshape(B, T, C))
        x = x + block.mlp(block.ln_2(x))
    return model.lm_head(tr.ln_f(x))[:, -1]


_DECODE_HINTS = {
    "no_append": "your newest query attends only to its own key and value: append this step's k and v to the "
                 "cached ones (along the time axis) and attend over all of them.",
    "causal_one": "your newest query attends only to the first position: a causal mask built for a single query "
                  "(is_causal=True, or the tril of a 1 x T matrix) hides every key but the first. The newest "
                  "token comes after every cached one, so it may see them all: no mask.",
    "stuck": "your position index does not advance: the new token's position is the number of positions "
             "already cached (0, 1, 2, ...), and that is the row of wpe to add.",
}


def _keys_and_values(model, idx):
    """Each layer's (k, v) for the whole prefix idx, (B, H, T, d) each, read off the output of its c_attn
    during a full forward (the oracle of the cache)."""
    outputs, hooks = [], [block.attn.c_attn.register_forward_hook(lambda mod, args, out: outputs.append(out))
                          for block in model.transformer.h]
    try:
        model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    B, T = idx.shape
    H, C = model.config.n_head, model.config.n_embd
    split = [out.split(C, dim=2)[1:] for out in outputs]
    return [tuple(z.reshape(B, T, H, C // H).permute(0, 2, 1, 3) for z in kv) for kv in split]


@exercise
def decode_step(your_decode_step):
    """decode_step(model, token, cache): one KV-cache step; its logits must equal the full forward's last position."""
    g = _torch_rng()
    model = _random_gpt(g, block_size=12)
    ref = _reference_copy(model)
    _forbid(model, "model(...)", "run the embeddings, each layer's attention with the cache, the MLP, ln_f and "
                                 "lm_head yourself.")
    for block in model.transformer.h:
        _forbid(block, "a block's forward (block(x))", "a block's attention must use the cache; call block.ln_1, "
                                                       "block.attn.c_attn, block.attn.c_proj, block.ln_2 and block.mlp.")
        _forbid(block.attn, "block.attn(x)", "compute q, k, v with block.attn.c_attn and attend over the cache yourself.")
    B, P = 2, int(rng().integers(6, model.config.block_size + 1))
    prompt = torch.randint(0, model.config.vocab_size, (B, P), generator=g)
    n_layer, H = model.config.n_layer, model.config.n_head
    d = model.config.n_embd // H
    cache = [None] * n_layer
    wrong_caches = {mode: [None] * n_layer for mode in _DECODE_HINTS}
    for t in range(P):
        token = prompt[:, t:t + 1]
        with torch.no_grad():
            full = ref(prompt[:, :t + 1])[0][:, -1]
            ref_cache = _keys_and_values(ref, prompt[:, :t + 1])
            mistakes = {_DECODE_HINTS[m]: _decode_variant(ref, token, c, m) for m, c in wrong_caches.items()}
            yours = your_decode_step(model, token.clone(), cache)
        assert_close(yours, full, what=f"the output of step {t} (token {t} of a prompt of {P}, with {t} positions cached)",
                     rtol=1e-9, atol=1e-10, inputs={"prompt": prompt[:, :t + 1]}, mistakes=mistakes,
                     hint="they should equal the full forward's logits at the last position of prompt[:, :t+1].")
        require(isinstance(cache, list) and len(cache) == n_layer,
                f"after step {t}, cache should still be the list of {n_layer} layers it was given; got {fmt(cache)}.")
        for layer in range(n_layer):
            entry = cache[layer]
            require(isinstance(entry, (tuple, list)) and len(entry) == 2,
                    f"after step {t}, cache[{layer}] should be the pair (k, v) of that layer; got {fmt(entry)}.",
                    hint="store cache[layer] = (k, v), the keys and values of every position so far.")
            for name, yours_kv, ref_kv in zip("kv", entry, ref_cache[layer]):
                require(tuple(yours_kv.shape) == (B, H, t + 1, d),
                        f"after step {t}, cache[{layer}]'s {name} has shape {tuple(yours_kv.shape)}; expected "
                        f"{(B, H, t + 1, d)}: (batch, heads, positions so far, head size).")
                assert_close(yours_kv, ref_kv, what=f"cache[{layer}]'s {name} after step {t}", rtol=1e-9, atol=1e-10)
    return "every step of a random prompt through a 2-layer GPT in float64, against its full forward"
