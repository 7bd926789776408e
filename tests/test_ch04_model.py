"""The course GPT: Hugging Face GPT-2 equivalence, hand-written vs fused attention, the KV cache."""

import pytest
import torch
import torch.nn.functional as F

from course_lib.gpt.generate import generate, sample_next, top_k_filter
from course_lib.gpt.model import GPT, GPTConfig, KVCache, causal_attention


def small_config(**kw):
    base = dict(vocab_size=71, block_size=23, n_layer=3, n_head=4, n_embd=36, dropout=0.0)
    return GPTConfig(**{**base, **kw})


def randomize(model, seed=0):
    """Random values in every parameter (biases and LayerNorm too), so nothing hides behind a 0 or 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def test_logits_match_transformers_gpt2():
    transformers = pytest.importorskip("transformers")
    c = small_config()
    hc = transformers.GPT2Config(vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd,
                                 n_layer=c.n_layer, n_head=c.n_head, resid_pdrop=0.0, embd_pdrop=0.0,
                                 attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    hf = randomize(transformers.GPT2LMHeadModel(hc)).eval()
    idx = torch.randint(0, c.vocab_size, (3, c.block_size))
    expected = hf(idx).logits
    for sdpa in (True, False):
        ours = GPT.from_hf_state_dict(hf.state_dict(), small_config(sdpa=sdpa)).eval()
        torch.testing.assert_close(ours(idx)[0], expected, rtol=1e-5, atol=1e-5)
    # and back: our weights, in GPT-2's layout, load strictly into GPT2LMHeadModel
    hf2 = transformers.GPT2LMHeadModel(hc).eval()
    hf2.load_state_dict(ours.to_hf_state_dict(), strict=True)
    torch.testing.assert_close(hf2(idx).logits, expected, rtol=1e-5, atol=1e-5)


def test_parameter_names_and_tied_head():
    m = GPT(small_config())
    names = dict(m.named_parameters())
    assert "transformer.h.2.attn.c_attn.weight" in names and "transformer.ln_f.bias" in names
    assert m.lm_head.weight is m.transformer.wte.weight
    assert m.transformer.h[0].mlp.c_fc.weight.shape == (4 * 36, 36)     # nn.Linear: (out, in)


def test_gpt2_initialization():
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=8, n_embd=128, vocab_size=300))
    std = lambda p: p.detach().std().item()
    assert abs(std(m.transformer.wte.weight) - 0.02) < 0.002
    assert abs(std(m.transformer.h[0].attn.c_proj.weight) - 0.02 / 4) < 0.001    # 0.02 / sqrt(2 * 8)
    assert m.transformer.h[0].attn.c_attn.bias.abs().max() == 0
    assert torch.equal(m.transformer.h[0].ln_1.weight, torch.ones(128))


@pytest.mark.parametrize("Tq, Tk", [(7, 7), (1, 9), (3, 10)])
def test_hand_attention_matches_sdpa(Tq, Tk):
    g = torch.Generator().manual_seed(Tq * 31 + Tk)
    q = torch.randn(2, 3, Tq, 5, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 3, Tk, 5, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)
    out, w = causal_attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, Tq, dtype=torch.float64))


def test_attention_maps_are_causal_rows_of_probabilities():
    m = randomize(GPT(small_config()), 1).eval()
    maps = m.attention_maps(torch.randint(0, 71, (2, 11)))
    assert len(maps) == 3 and maps[0].shape == (2, 4, 11, 11)
    for w in maps:
        assert torch.all(w.triu(1) == 0)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 11))


def test_cache_gives_the_same_logits_as_full_forward():
    m = randomize(GPT(small_config()), 2).eval()
    idx = torch.randint(0, 71, (2, 17))
    full, _ = m(idx)
    cache = KVCache(3)
    parts = [m(idx[:, :9], cache=cache)[0]] + [m(idx[:, t:t + 1], cache=cache)[0] for t in range(9, 17)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-5, atol=1e-5)
    assert len(cache) == 17


@pytest.mark.parametrize("temperature, top_k", [(0, None), (1.0, None), (0.8, 5)])
def test_cached_and_uncached_generation_give_the_same_tokens(temperature, top_k):
    m = GPT(small_config(n_embd=24)).eval()   # default init: a softer distribution, real sampling
    prompt = torch.randint(0, 71, (2, 5))
    runs = [generate(m, prompt, 40, temperature, top_k, use_cache=c, generator=torch.Generator().manual_seed(3))
            for c in (True, False)]            # 45 > block_size 23: also the cropped regime
    assert runs[0].shape == (2, 45)
    assert torch.equal(runs[0], runs[1])


def test_top_k_keeps_exactly_k_and_sampling_respects_it():
    logits = torch.tensor([[0.3, 2.0, -1.0, 1.5, 0.9, 1.9]])
    kept = top_k_filter(logits, 3)
    assert torch.isfinite(kept).sum() == 3 and torch.isfinite(kept[0, [1, 3, 5]]).all()
    g = torch.Generator().manual_seed(0)
    draws = {sample_next(logits, 1.0, 2, generator=g).item() for _ in range(200)}
    assert draws == {1, 5}
    assert sample_next(logits, 0).item() == 1


def test_loss_is_cross_entropy_and_too_long_input_is_refused():
    m = GPT(small_config())
    idx, tgt = torch.randint(0, 71, (2, 8)), torch.randint(0, 71, (2, 8))
    logits, loss = m(idx, tgt)
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, 71), tgt.reshape(-1)))
    with pytest.raises(ValueError, match="block_size"):
        m(torch.zeros(1, 24, dtype=torch.long))


def test_bias_false_is_nanogpts_variant():
    """GPTConfig(bias=False): no bias anywhere (linear layers, LayerNorms); gelu="none": the exact GELU."""
    m = randomize(GPT(small_config(bias=False, gelu="none")), 4).eval()
    names = [n for n, _ in m.named_parameters()]
    assert not [n for n in names if n.endswith(".bias")], names
    assert m.transformer.ln_f.bias is None and m.transformer.h[0].mlp.c_fc.bias is None
    block, x = m.transformer.h[1].double(), torch.randn(2, 5, 36, dtype=torch.float64)
    with torch.no_grad():
        h = F.layer_norm(x, (36,), block.ln_2.weight, None, 1e-5)
        expected = F.gelu(h @ block.mlp.c_fc.weight.T) @ block.mlp.c_proj.weight.T   # exact GELU
        torch.testing.assert_close(block.mlp(block.ln_2(x)), expected)
        assert not torch.allclose(F.gelu(h, approximate="tanh"), F.gelu(h), rtol=0, atol=1e-7)


def test_the_attention_kernel_is_chosen_once_when_the_model_is_built():
    from course_lib.gpt import model as gm

    for kw, kernel in ((dict(), gm.sdpa_attention), (dict(sdpa=False), gm.written_out_attention),
                       (dict(fused=True), gm.fused_attention)):
        assert all(b.attn.attend is kernel for b in GPT(small_config(**kw)).transformer.h)
    # the written-out path and SDPA compute the same model, with and without a cache
    a = randomize(GPT(small_config()), 5).eval()
    b = GPT(small_config(sdpa=False)).eval()
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 71, (2, 13))
    torch.testing.assert_close(a(idx)[0], b(idx)[0], rtol=1e-5, atol=1e-5)
    ca, cb = KVCache(3), KVCache(3)
    a(idx[:, :6], cache=ca), b(idx[:, :6], cache=cb)
    torch.testing.assert_close(a(idx[:, 6:9], cache=ca)[0], b(idx[:, 6:9], cache=cb)[0], rtol=1e-5, atol=1e-5)


def test_attention_maps_are_the_weights_of_each_layers_own_queries_and_keys():
    m = randomize(GPT(small_config()), 6).eval()
    idx = torch.randint(0, 71, (2, 9))
    maps = m.attention_maps(idx)
    with torch.no_grad():   # layer 0 by hand: ln_1 of the embeddings, c_attn, split into heads
        x = m.transformer.wte(idx) + m.transformer.wpe(torch.arange(9))
        q, k, _ = m.transformer.h[0].attn.c_attn(m.transformer.h[0].ln_1(x)).split(36, dim=2)
        q, k = (t.view(2, 9, 4, 9).transpose(1, 2) for t in (q, k))
        scores = (q @ k.transpose(-2, -1) / 3.0).masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
        torch.testing.assert_close(maps[0], scores.softmax(-1))
    assert not hasattr(m.transformer.h[0].attn, "last_weights")   # the forward pass keeps nothing
