"""Chapter 12's course answers (course_lib/capstone) against chapter 04's PyTorch GPT, on the numpy and Numba
backends: the same parameter names; logits, loss and gradients from the same weights (1e-9 in float64, 1e-4
in float32); the same greedy tokens and sampling probabilities; chapter 04's `train` history, step for step;
a run resumed from a checkpoint equal, bit for bit, to one that never stopped.
"""

import os

import numpy as np
import pytest
import torch

import course_lib.tensor as ct
from course_lib.capstone import COURSE, GPT, configure_optimizer, functions, train_step
from course_lib.capstone import optim as course_optim
from course_lib.capstone.sample import generate as course_generate
from course_lib.capstone.train import train as course_train
from course_lib.data import load_text
from course_lib.gpt import trainer
from course_lib.gpt.data import Batches
from course_lib.gpt.generate import generate, top_k_filter
from course_lib.gpt.model import GPT as TorchGPT
from course_lib.gpt.model import GPTConfig
from course_lib.gpt.tokenizers import CharTokenizer
from course_lib.gpt.trainer import TrainConfig
from course_lib.tensor import OPS, use_backend, use_ops

CONFIG = GPTConfig(vocab_size=41, block_size=16, n_layer=2, n_head=4, n_embd=32, dropout=0.0)


@pytest.fixture(params=["numpy", "numba"])
def backend(request):
    with use_backend(request.param):
        yield request.param


def reference(dtype=torch.float64, seed=0, config=CONFIG):
    torch.manual_seed(seed)
    return TorchGPT(config).to(dtype)


def torch_batches(batches):
    return lambda split: tuple(torch.from_numpy(a) for a in batches.get(split))


def test_parameter_names_match_chapter_04():
    ref, ours = reference(), GPT(CONFIG)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert list(ours.state_dict()) == list(ref.state_dict())        # lm_head.weight too: tied, saved twice
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


def test_the_course_gpt_runs_its_fused_functions_unless_others_are_in():
    """Its forward puts the course's Functions in the registry's free places: one node per op; a learner's
    Function put in from outside stays."""
    ours = GPT.from_torch(reference(seed=2))
    idx = np.random.default_rng(2).integers(0, CONFIG.vocab_size, (2, 9))
    _, loss = ours(idx, idx)
    names = [n._fn.__name__ for n in ct.autodiff.topological_order(loss) if n._fn is not None]
    assert names.count("LayerNorm") == 2 * CONFIG.n_layer + 1 and names.count("CausalAttention") == CONFIG.n_layer
    assert names.count("GELU") == CONFIG.n_layer and "Softmax" not in names     # attention holds its softmax

    class MyLayerNorm(functions.LayerNorm):
        pass

    with use_ops(LayerNorm=MyLayerNorm):
        _, loss = ours(idx, idx)
    names = [n._fn.__name__ for n in ct.autodiff.topological_order(loss) if n._fn is not None]
    assert names.count("MyLayerNorm") == 2 * CONFIG.n_layer + 1 and "LayerNorm" not in names
    assert OPS.LayerNorm is ct.functions.LayerNorm and OPS.Softmax is ct.functions.Softmax     # restored after


def test_greedy_generation_matches_chapter_04s_past_block_size(backend):
    ref = reference(seed=4).float()
    ours = GPT.from_torch(ref)
    prompt = np.random.default_rng(4).integers(0, CONFIG.vocab_size, (2, 5))
    want = generate(ref, torch.tensor(prompt), max_new_tokens=14, temperature=0)   # runs past block_size
    got = course_generate(ours, prompt, 14, 1.0, 1, lambda p: p.argmax(-1))       # top_k = 1 is greedy
    np.testing.assert_array_equal(got, want.numpy())


def test_sampling_hands_draw_chapter_04s_probabilities():
    ref = reference(seed=6)
    ours = GPT.from_torch(ref)
    prompt = np.random.default_rng(6).integers(0, CONFIG.vocab_size, (2, 3))
    seen, rng = [], np.random.default_rng(1)

    def draw(probs):
        seen.append(probs)
        return [rng.choice(len(row), p=row) for row in probs]

    out = course_generate(ours, prompt, 20, 1.3, 9, draw)
    for step, probs in enumerate(seen):
        with torch.no_grad():
            logits = ref(torch.from_numpy(out[:, :3 + step][:, -CONFIG.block_size:]))[0][:, -1]
        want = torch.softmax(top_k_filter(logits / 1.3, 9), -1).numpy()
        np.testing.assert_allclose(probs, want, rtol=1e-9, atol=1e-12)
    assert out.shape == (2, 23) and (out[:, :3] == prompt).all()


def test_train_follows_chapter_04s_train_in_float64(backend):
    """The course's loop, with its AdamW, schedule and clipping, against chapter 04's `train` on PyTorch: every
    step's loss and lr, every evaluation."""
    text = load_text()[:20000]
    tok = CharTokenizer(text)
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0)
    cfg = TrainConfig(max_iters=6, batch_size=3, lr=3e-3, warmup_iters=2, lr_decay_iters=5, min_lr=1e-3,
                      eval_interval=2, eval_iters=2)
    ref = reference(config=config)
    ours = GPT.from_torch(ref)
    theirs = trainer.train(ref, torch_batches(Batches(tok.encode(text), 16, 3, seed=2)), cfg, progress=False)
    mine = course_train(ours, configure_optimizer(ours, cfg), Batches(tok.encode(text), 16, 3, seed=2), cfg, COURSE)
    assert set(mine) == set(theirs) - {"ms_per_iter"} and mine["iter"] == theirs["iter"] == list(range(6))
    assert mine["lr"] == theirs["lr"] and mine["eval_iter"] == theirs["eval_iter"] == [0, 2, 4, 6]
    for key in ("loss", "train_loss", "val_loss"):
        np.testing.assert_allclose(mine[key], theirs[key], rtol=0, atol=1e-10, err_msg=key)
    assert theirs["loss"][-1] < theirs["loss"][0]          # it learns: the comparison is not between flat lines


def test_a_resumed_run_equals_the_run_that_never_stopped(tmp_path):
    """Stopped after 3 steps, resumed by a model of other weights, a fresh optimizer and other draws: the same
    losses and the same weights, bit for bit, in float32 too."""
    tokens = np.random.default_rng(0).integers(0, CONFIG.vocab_size, 600)
    cfg = TrainConfig(max_iters=7, batch_size=2, lr=1e-2, warmup_iters=2, lr_decay_iters=7, eval_interval=3,
                      eval_iters=1)
    ct.manual_seed(0)
    whole = GPT(CONFIG)
    start = whole.state_dict()
    history = course_train(whole, configure_optimizer(whole, cfg), Batches(tokens, 16, 2, seed=1), cfg, COURSE)
    path = os.fspath(tmp_path / "run.ckpt")
    first = GPT(CONFIG)
    first.load_state_dict(start)
    course_train(first, configure_optimizer(first, cfg), Batches(tokens, 16, 2, seed=1),
                 TrainConfig(**{**cfg.__dict__, "max_iters": 3}), COURSE, checkpoint=path, save_every=3)
    later = GPT(CONFIG)
    rest = course_train(later, configure_optimizer(later, cfg), Batches(tokens, 16, 2, seed=9), cfg, COURSE,
                        checkpoint=path, resume=True)
    assert rest["iter"] == [3, 4, 5, 6] and rest["loss"] == history["loss"][3:]
    assert all(np.array_equal(p.numpy(), q.numpy()) for p, q in zip(whole.parameters(), later.parameters()))


def test_the_recipes_step_on_the_course_library_equals_pytorchs():
    ref = reference(seed=7)
    ours = GPT.from_torch(ref)
    cfg = TrainConfig(lr=3e-3)
    their_opt, our_opt = trainer.configure_optimizer(ref, cfg), configure_optimizer(ours, cfg)
    rng = np.random.default_rng(7)
    for _ in range(3):
        x, y = rng.integers(0, CONFIG.vocab_size, (2, 3, 11))
        a = float(train_step(ours, our_opt, x, y))
        b = float(trainer.train_step(ref, their_opt, torch.from_numpy(x), torch.from_numpy(y)))
        assert abs(a - b) < 1e-10
    named = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.numpy(), named[name].detach().numpy(), rtol=0, atol=1e-10, err_msg=name)


def test_the_groups_decay_matrices_only():
    ours = GPT(CONFIG)
    decay, rest = course_optim.param_groups(ours, 0.1)
    assert decay["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decay["params"]) and all(p.ndim == 1 for p in rest["params"])
    assert len(decay["params"]) + len(rest["params"]) == len(ours.parameters())


@pytest.mark.slow
def test_nanogpt_cpu_config_loss_curve_matches_for_20_steps(backend):
    """Opt-in (--slow): nanoGPT's CPU config (4 layers, 4 heads, 128 wide, block 64, batch 12), 20 steps."""
    text = load_text()
    tok = CharTokenizer(text)
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
    cfg = TrainConfig(max_iters=20, eval_interval=0, eval_iters=1)
    ref = reference(config=config)
    ours = GPT.from_torch(ref)
    theirs = trainer.train(ref, torch_batches(Batches(tok.encode(text), 64, 12, seed=3)), cfg, progress=False)
    mine = course_train(ours, configure_optimizer(ours, cfg), Batches(tok.encode(text), 64, 12, seed=3), cfg, COURSE)
    np.testing.assert_allclose(mine["loss"], theirs["loss"], rtol=0, atol=1e-6)
