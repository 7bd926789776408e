"""Chapter 12's GPT on course_lib.tensor against chapter 04's PyTorch GPT, on the numpy and Numba backends:
the same parameter names; logits, loss and gradients from the same weights (1e-9 in float64, 1e-4 in
float32); the same greedy tokens; and the same loss curve over a few training steps in float64.
"""

import numpy as np
import pytest
import torch

from course_lib import capstone
from course_lib.capstone import GPT, compare_training
from course_lib.data import load_text
from course_lib.gpt import make_get_batch, trainer
from course_lib.gpt.generate import generate
from course_lib.gpt.model import GPT as TorchGPT
from course_lib.gpt.model import GPTConfig
from course_lib.gpt.tokenizers import CharTokenizer
from course_lib.gpt.trainer import TrainConfig
from course_lib.tensor import use_backend

CONFIG = GPTConfig(vocab_size=41, block_size=16, n_layer=2, n_head=4, n_embd=32, dropout=0.0)


@pytest.fixture(params=["numpy", "numba"])
def backend(request):
    with use_backend(request.param):
        yield request.param


def reference(dtype=torch.float64, seed=0, config=CONFIG):
    torch.manual_seed(seed)
    return TorchGPT(config).to(dtype)


def test_parameter_names_match_chapter_04():
    ref, ours = reference(), GPT(CONFIG)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert list(ours.state_dict()) == list(ref.state_dict())        # lm_head.weight too: tied, saved twice
    assert ours.num_params() == ref.num_params()
    assert ours.lm_head.weight is ours.transformer.wte.weight
    ours.load_state_dict(ref.state_dict())                            # torch tensors load as they are
    np.testing.assert_array_equal(ours.transformer.h[1].mlp.c_fc.weight.numpy(),
                                  ref.transformer.h[1].mlp.c_fc.weight.detach().numpy())


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-9), (torch.float32, 1e-4)])
def test_logits_loss_and_gradients_match(backend, dtype, tol):
    ref = reference(dtype, seed=3)
    ours = GPT.from_torch(ref)
    rng = np.random.default_rng(3)
    idx, targets = rng.integers(0, CONFIG.vocab_size, (2, 2, 13))    # T = 13 < block_size
    logits, loss = ours(idx, targets)
    want, want_loss = ref(torch.tensor(idx), torch.tensor(targets))
    assert logits.dtype == np.dtype(str(dtype).split(".")[1])
    np.testing.assert_allclose(logits.numpy(), want.detach().numpy(), rtol=tol, atol=tol)
    assert abs(loss.item() - want_loss.item()) < tol
    loss.backward()
    want_loss.backward()
    ours_grads = dict(ours.named_parameters())
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(ours_grads[name].grad.numpy(), p.grad.numpy(), rtol=tol, atol=tol, err_msg=name)


def test_greedy_generation_matches(backend):
    ref = reference(seed=4).float()
    ours = GPT.from_torch(ref)
    prompt = np.random.default_rng(4).integers(0, CONFIG.vocab_size, (2, 5))
    want = generate(ref, torch.tensor(prompt), max_new_tokens=14, temperature=0)   # runs past block_size
    np.testing.assert_array_equal(ours.generate(prompt, 14, temperature=0), want.numpy())


def test_sampling_is_seeded_and_respects_top_k():
    ours = GPT.from_torch(reference(seed=5))
    prompt = np.random.default_rng(5).integers(0, CONFIG.vocab_size, (3, 4))
    a = ours.generate(prompt, 6, temperature=0.8, top_k=1, generator=torch.Generator().manual_seed(1))
    np.testing.assert_array_equal(a, ours.generate(prompt, 6, temperature=0))       # top_k=1 is greedy
    b = ours.generate(prompt, 6, temperature=1.5, generator=torch.Generator().manual_seed(2))
    np.testing.assert_array_equal(b, ours.generate(prompt, 6, temperature=1.5, generator=torch.Generator().manual_seed(2)))
    assert b.shape == (3, 10) and (b[:, :4] == prompt).all()


def test_sampling_draws_the_tokens_of_chapter_04s_gpt_in_float64():
    """One sampling loop for both GPTs: from the same float64 weights and the same seed, the same tokens,
    past block_size too (chapter 04's with its KV cache, the capstone's rerunning the context)."""
    ref = reference(seed=6)
    ours = GPT.from_torch(ref)
    prompt = np.random.default_rng(6).integers(0, CONFIG.vocab_size, (2, 3))
    want = generate(ref, torch.tensor(prompt), 20, temperature=1.3, top_k=9, generator=torch.Generator().manual_seed(8))
    got = ours.generate(prompt, 20, temperature=1.3, top_k=9, generator=torch.Generator().manual_seed(8))
    np.testing.assert_array_equal(got, want.numpy())


def test_training_loss_curve_matches_in_float64(backend):
    """A few steps of chapter 04's recipe (AdamW with groups, warmup, clipping) on the course corpus."""
    text = load_text()[:20000]
    tok = CharTokenizer(text)
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0)
    cfg = TrainConfig(batch_size=4, lr=3e-3, warmup_iters=2, lr_decay_iters=6, min_lr=1e-3)
    theirs, ours = compare_training(config, cfg, tok.encode(text), steps=6)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)
    assert theirs[-1] < theirs[0]          # it learns: the comparison is not between two flat lines


def test_one_train_function_trains_both_gpts_alike_in_float64():
    """Chapter 04's `train`, given the course's library, follows PyTorch's run from the same weights on the
    same batches: every step's loss and lr, every evaluation, in chapter 04's history format."""
    text = load_text()[:20000]
    tok = CharTokenizer(text)
    ids = torch.tensor(tok.encode(text))
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0)
    cfg = TrainConfig(max_iters=5, batch_size=3, lr=3e-3, warmup_iters=2, lr_decay_iters=4, min_lr=1e-3,
                      eval_interval=2, eval_iters=2)
    ref = reference(config=config)
    ours = GPT.from_torch(ref)
    theirs = trainer.train(ref, make_get_batch(ids, 16, 3, seed=2), cfg, progress=False)
    mine = capstone.train(ours, make_get_batch(ids, 16, 3, seed=2), cfg)
    assert set(mine) == set(theirs) and mine["iter"] == theirs["iter"] == list(range(5))
    assert mine["lr"] == theirs["lr"] and mine["eval_iter"] == theirs["eval_iter"] == [0, 2, 4, 5]
    for key in ("loss", "train_loss", "val_loss"):
        np.testing.assert_allclose(mine[key], theirs[key], rtol=0, atol=1e-10, err_msg=key)


@pytest.mark.slow
def test_nanogpt_cpu_config_loss_curve_matches_for_20_steps(backend):
    """Opt-in (--slow, about 30 s): nanoGPT's CPU config (4 layers, 4 heads, 128 wide, block 64, batch 12)."""
    text = load_text()
    tok = CharTokenizer(text)
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
    theirs, ours = compare_training(config, TrainConfig(), tok.encode(text), steps=20)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)
