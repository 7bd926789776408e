"""The Mamba LM: Hugging Face parameter layout and logits, recurrent state equal to the full sequence."""

import pytest
import torch

from course_lib.mamba import Mamba, MambaCache, MambaConfig
from course_lib.mamba.generate import generate

transformers = pytest.importorskip("transformers")


def random_model(seed=0, **kw):
    torch.manual_seed(seed)
    config = MambaConfig(**{**dict(vocab_size=37, d_model=24, n_layer=2, d_state=5, d_conv=3), **kw})
    model = Mamba(config)
    with torch.no_grad():     # weights far from the init, so every parameter matters
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


def hf_model(config):
    hf = transformers.MambaForCausalLM(transformers.MambaConfig(**config.hf_kwargs()))
    return hf.eval()


def test_state_dict_layout_matches_hugging_face():
    model = random_model()
    ours, theirs = model.state_dict(), hf_model(model.config).state_dict()
    assert set(ours) == set(theirs)
    for k in theirs:
        assert ours[k].shape == theirs[k].shape, k


@pytest.mark.parametrize("scan", ["sequential", "parallel", "chunked"])
def test_logits_equal_hugging_face(scan):
    model = random_model(seed=1, scan=scan, d_model=20, dt_rank=3, expand=2)
    hf = hf_model(model.config)
    hf.load_state_dict(model.state_dict())
    idx = torch.randint(0, 37, (3, 29), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], hf(idx).logits, rtol=1e-5, atol=1e-5)


def test_hugging_face_weights_load_into_ours():
    config = MambaConfig(vocab_size=31, d_model=16, n_layer=3, d_state=4)
    torch.manual_seed(5)
    hf = hf_model(config)
    model = Mamba(config).eval()
    model.load_state_dict(hf.state_dict())
    idx = torch.randint(0, 31, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], hf(idx).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prompt", [1, 2, 9])
def test_recurrent_equals_full_sequence(prompt):
    model = random_model(seed=2)
    idx = torch.randint(0, 37, (2, 21), generator=torch.Generator().manual_seed(prompt))
    with torch.no_grad():
        full = model(idx)[0]
        cache = MambaCache(model.config.n_layer)
        first = model(idx[:, :prompt], cache=cache)[0]
        size = cache.nbytes()
        rest = [model(idx[:, t:t + 1], cache=cache)[0] for t in range(prompt, idx.shape[1])]
    torch.testing.assert_close(torch.cat([first] + rest, 1), full, rtol=1e-5, atol=1e-5)
    assert cache.nbytes() == size == 2 * 2 * model.config.d_inner * (model.config.d_conv - 1 + model.config.d_state) * 4


def test_generate_with_state_equals_rerunning():
    model = random_model(seed=3)
    prompt = torch.randint(0, 37, (2, 4), generator=torch.Generator().manual_seed(0))
    greedy = generate(model, prompt, 15, temperature=0)
    torch.testing.assert_close(greedy, generate(model, prompt, 15, temperature=0, use_cache=False))
    sampled = [generate(model, prompt, 15, temperature=1.0, top_k=10, use_cache=c,
                        generator=torch.Generator().manual_seed(7)) for c in (True, False)]
    torch.testing.assert_close(*sampled)


def test_forward_signature_trains_with_the_chapter_04_loop():
    from course_lib.gpt import TrainConfig, make_get_batch, train

    tokens = torch.arange(400) % 7          # a periodic sequence a model can learn quickly
    model = Mamba(MambaConfig(vocab_size=7, d_model=16, n_layer=1, d_state=4))
    config = TrainConfig(max_iters=30, lr=1e-2, warmup_iters=3, lr_decay_iters=30, eval_interval=10, eval_iters=2)
    hist = train(model, make_get_batch(tokens, 16, 4), config, progress=False)
    assert hist["eval_iter"] == [0, 10, 20, 30]           # evaluated before training, so there is a baseline
    assert hist["val_loss"][-1] < 0.5 * hist["val_loss"][0]
    assert hist["loss"][-1] < 1.0


def test_time_invariant_option_ignores_the_input():
    """selective=False: Δ, B, C are the same at every position and for every input; the model still runs."""
    torch.manual_seed(0)
    config = MambaConfig(vocab_size=11, d_model=16, n_layer=2, d_state=5, selective=False)
    block = Mamba(config).backbone.layers[0].mixer
    assert not hasattr(block, "x_proj") and block.B.shape == block.C.shape == (5,)
    x1, x2 = torch.randn(2, 9, config.d_inner), torch.randn(2, 9, config.d_inner) * 3
    p1, p2 = block.ssm_params(x1), block.ssm_params(x2)
    for a, b, width in zip(p1, p2, (config.d_inner, 5, 5)):
        assert a.shape == (2, 9, width)
        torch.testing.assert_close(a, b, rtol=0, atol=0)                          # whatever the input
        torch.testing.assert_close(a, a[:1, :1].expand_as(a), rtol=0, atol=0)     # at every position
    selective = MambaConfig(vocab_size=11, d_model=16, n_layer=2, d_state=5).selective
    assert selective, "the default stays selective"
    sel_block = Mamba(MambaConfig(vocab_size=11, d_model=16, n_layer=2, d_state=5)).backbone.layers[0].mixer
    assert not torch.allclose(sel_block.ssm_params(x1)[0], sel_block.ssm_params(x2)[0])


def test_time_invariant_recurrent_equals_full_sequence():
    model = random_model(seed=4, selective=False)
    idx = torch.randint(0, 37, (2, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(idx)[0]
        cache = MambaCache(model.config.n_layer)
        parts = [model(idx[:, :3], cache=cache)[0]] + [model(idx[:, t:t + 1], cache=cache)[0] for t in range(3, 13)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-5, atol=1e-5)


def test_selective_copy_batch():
    from course_lib.mamba.tasks import FILLER, IGNORE, RECALL, selective_copy_batch

    x, y = selective_copy_batch(50, length=20, n_marked=3, n_values=5, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (50, 23)
    assert (x[:, 20:] == RECALL).all() and (y[:, :20] == IGNORE).all()
    for xs, ys in zip(x, y):
        data = xs[:20][xs[:20] != FILLER]
        assert len(data) == 3 and ((data >= 2) & (data < 7)).all()
        assert torch.equal(data, ys[20:])          # the marked tokens, in their order
