"""The compiler (course_lib.compiler): a compiled step gives the eager step's numbers, in float64 to 1e-12,
on chapter 02's MLP and the capstone GPT (and PyTorch's, as an independent oracle); it fuses what it
promises; a replay allocates nothing and a second compile compiles nothing; and each thing it cannot do is
said in one line that names the code."""

import math
import tracemalloc

import numpy as np
import pytest
import torch

from course_lib import tensor as T
from course_lib.capstone import COURSE, GPT
from course_lib.capstone import configure_optimizer as eager_optimizer
from course_lib.capstone import train_step as eager_step
from course_lib.compiler import Pieces, capturable, kernels
from course_lib.compiler import compile as compile_step
from course_lib.compiler.capturable import CAPTURABLE
from course_lib.compiler.plan import place
from course_lib.gpt import configure_optimizer as torch_optimizer
from course_lib.gpt import train_step as torch_step
from course_lib.gpt.model import GPT as TorchGPT
from course_lib.gpt.model import GPTConfig
from course_lib.gpt.trainer import TORCH, TrainConfig, lr_at, train_step
from course_lib.gpt.trainer import configure_optimizer as recipe_optimizer
from course_lib.tensor import Function

CONFIG = GPTConfig(vocab_size=19, block_size=11, n_layer=2, n_head=3, n_embd=15, dropout=0.0)
TRAIN = TrainConfig(lr=1e-3, warmup_iters=4, lr_decay_iters=20, batch_size=3)


def mlp(seed=0, dtype=np.float64, optimizer=capturable.Adam):
    T.manual_seed(seed)
    model = T.nn.Sequential(T.nn.Linear(7, 13, dtype=dtype), T.nn.ReLU(), T.nn.Linear(13, 5, dtype=dtype))
    return model, optimizer(model.parameters(), lr=0.01)


def mlp_step(model, optimizer, x, y):
    loss = T.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def batches(count, rows=6, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(rows, 7)), rng.integers(0, 5, rows)) for _ in range(count)]


# ---- equal to eager ----------------------------------------------------------------------------------


def test_the_mlp_step_compiled_equals_eager_in_float64():
    eager_model, eager_opt = mlp()
    model, opt = mlp()
    step = compile_step(mlp_step, verbose=False)
    for x, y in batches(20):
        expected = mlp_step(eager_model, eager_opt, T.Tensor(x), y).item()
        assert abs(step(model, opt, T.Tensor(x), y).item() - expected) <= 1e-12
    assert step.stats.replays >= 17 and step.stats.captures == 3
    for p, q in zip(eager_model.parameters(), model.parameters()):
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(q.numpy(), p.numpy(), rtol=0, atol=1e-12)


@pytest.fixture(scope="module")
def gpt_runs():
    """20 float64 steps of the capstone GPT three ways from the same weights and batches: chapter 12's eager
    step (its AdamW in numpy, clipping that reads the norm), the compiled capturable step, and chapter 04's
    PyTorch GPT; the learning rate follows the warmup and cosine schedule, set between calls by each
    library's set_lr."""
    from course_lib.tensor import backend
    backends_before = (set(backend.REGISTRY), T.current_backend_name())   # other test files may have added some
    torch.manual_seed(3)
    reference = TorchGPT(CONFIG).double()
    eager_model, model = GPT.from_torch(reference), GPT.from_torch(reference)
    eager_opt, opt = eager_optimizer(eager_model, TRAIN), recipe_optimizer(model, TRAIN, CAPTURABLE)
    theirs = TorchGPT(CONFIG).double()
    theirs.load_state_dict(reference.state_dict())
    their_opt = torch_optimizer(theirs, TRAIN)
    step = compile_step(train_step, verbose=False)
    rng = np.random.default_rng(7)
    losses = {"eager": [], "compiled": [], "torch": []}
    for it in range(20):
        x, y = (rng.integers(0, CONFIG.vocab_size, (3, 10)) for _ in range(2))
        lr = lr_at(it, TRAIN)
        COURSE.set_lr(eager_opt, lr)
        CAPTURABLE.set_lr(opt, lr)
        TORCH.set_lr(their_opt, lr)
        losses["eager"].append(eager_step(eager_model, eager_opt, x, y).item())
        losses["compiled"].append(step(model, opt, x, y, TRAIN.grad_clip, CAPTURABLE).item())
        losses["torch"].append(torch_step(theirs, their_opt, torch.from_numpy(x), torch.from_numpy(y)).item())
    return dict(losses=losses, step=step, models=(eager_model, model, theirs), backends_before=backends_before)


def test_the_gpt_step_compiled_equals_eager_in_float64(gpt_runs):
    eager, compiled = np.array(gpt_runs["losses"]["eager"]), np.array(gpt_runs["losses"]["compiled"])
    assert np.abs(eager - compiled).max() <= 1e-12
    assert gpt_runs["step"].stats.replays == 17 and gpt_runs["step"].eager_reason is None
    eager_model, model, _ = gpt_runs["models"]
    arenas = list(gpt_runs["step"].program.arenas.values())
    for (name, p), q in zip(eager_model.named_parameters(), model.parameters()):
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(q.numpy(), p.numpy(), rtol=0, atol=1e-12, err_msg=name)
        # the model keeps its parameters and gradients in memory of its own, not in the replay's arena
        assert not any(np.shares_memory(q.data.storage, a) or np.shares_memory(q.grad.data.storage, a) for a in arenas)


def test_the_gpt_step_compiled_equals_pytorch_in_float64(gpt_runs):
    compiled, theirs = np.array(gpt_runs["losses"]["compiled"]), np.array(gpt_runs["losses"]["torch"])
    assert np.abs(compiled - theirs).max() <= 1e-10
    _, model, torch_model = gpt_runs["models"]
    named = dict(torch_model.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.numpy(), named[name].detach().numpy(), rtol=0, atol=1e-10, err_msg=name)


def test_the_learning_rate_set_between_calls_needs_no_new_capture(gpt_runs):
    step = gpt_runs["step"]
    assert len(step.programs) == 1 and step.stats.captures == 3


def test_a_capture_leaves_the_librarys_backends_as_it_found_them(gpt_runs):
    from course_lib.tensor import backend
    assert (set(backend.REGISTRY), T.current_backend_name()) == gpt_runs["backends_before"]
    assert {"numpy", "numba", "cuda"} <= set(backend.REGISTRY) and T.current_backend_name() == "numpy"


# ---- what it fuses ------------------------------------------------------------------------------------


def test_each_fused_op_of_the_forward_and_adams_update_are_one_kernel_each(gpt_runs):
    """Each fused op of the capstone's forward (the ops recorded inside it carry its name) computes all it does
    besides products in one kernel: each layer norm (two a block and the last), each GELU (one a block), and
    in each attention the scale, the causal mask and the softmax between its two products, which BLAS runs.
    Adam's update over the flat parameters is one kernel too."""
    program = gpt_runs["step"].program
    L = CONFIG.n_layer
    instances = {"LayerNorm.forward": 2 * L + 1, "GELU.forward": L, "CausalAttention.forward": L}
    for scope, count in instances.items():
        launches = [launch for launch in program.launches if launch.group is not None and launch.kind != "matmul"
                    and any(n.scope == scope for n in launch.nodes)]
        assert len(launches) == count and all(launch.kind == "kernel" for launch in launches), \
            f"{scope}: {[launch.describe() for launch in launches]}"
    attention = [launch for launch in program.launches if launch.group is not None
                 and any(n.scope == "CausalAttention.forward" for n in launch.nodes)]
    assert sum(launch.kind == "matmul" for launch in attention) == 2 * L
    assert all({"exp", "max", "where"} <= {n.op or n.kind for n in launch.nodes} for launch in attention
               if launch.kind == "kernel")   # the softmax (and the mask) are inside the one kernel
    flat = sum(p.numel() for p in gpt_runs["models"][1].parameters())
    updates = [launch for launch in program.kernels if launch.kernel.rows * launch.kernel.n == flat
               and any(n.op == "sqrt" for n in launch.nodes)]
    assert len(updates) == 1 and len(updates[0].nodes) >= 12


def test_products_stay_with_blas_and_each_launch_appears_once(gpt_runs):
    program = gpt_runs["step"].program
    products = [n for n in program.graph.nodes if n.kind == "matmul"]
    assert program.counts()["matmul"] == len(products)
    assert len(program.source.splitlines()) == len(program.launches) + 1


# ---- memory, caching ------------------------------------------------------------------------------------


def test_a_replay_allocates_nothing_and_the_plan_shares_memory(gpt_runs):
    step = gpt_runs["step"]
    _, model, _ = gpt_runs["models"]
    program = step.program
    rng = np.random.default_rng(1)
    x, y = (rng.integers(0, CONFIG.vocab_size, (3, 10)) for _ in range(2))
    args = [model, _optimizer_of(step), x, y, TRAIN.grad_clip, CAPTURABLE]
    step(*args)
    tracemalloc.start()
    step(*args)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 64_000, f"a replay allocated {peak} bytes"
    assert program.arena_bytes() < program.naive_bytes / 2


def _optimizer_of(step):
    expected, _ = step.programs[0]
    return expected[1][1]


def test_the_plan_never_gives_two_live_values_the_same_memory():
    rng = np.random.default_rng(0)
    sizes = {k: int(rng.integers(1, 300)) for k in range(60)}
    spans = {}
    for k in sizes:
        a = int(rng.integers(0, 40))
        spans[k] = (a, a + int(rng.integers(0, 8)))
    p = place(sizes, spans)
    for a in sizes:
        for b in sizes:
            if a < b and spans[a][0] <= spans[b][1] and spans[b][0] <= spans[a][1]:
                ea, eb = p.offsets[a] + sizes[a], p.offsets[b] + sizes[b]
                assert ea <= p.offsets[b] or eb <= p.offsets[a], (a, b)
    assert p.size <= p.naive and all(o % 16 == 0 for o in p.offsets.values())


def test_a_second_compile_of_the_same_model_compiles_nothing():
    model, opt = mlp(1)
    first = compile_step(mlp_step, verbose=False)
    for x, y in batches(4, seed=1):
        first(model, opt, T.Tensor(x), y)
    before = dict(kernels.STATS)
    again = compile_step(mlp_step, verbose=False)
    model2, opt2 = mlp(2)
    for x, y in batches(4, seed=2):
        again(model2, opt2, T.Tensor(x), y)
    assert again.program is not None
    assert kernels.STATS["compiled"] == before["compiled"] and kernels.STATS["loaded"] == before["loaded"]
    assert kernels.STATS["reused"] > before["reused"]


# ---- what it cannot do, said in one line ------------------------------------------------------------------


def test_another_shape_captures_again_with_one_line(capsys):
    model, opt = mlp(4)
    step = compile_step(mlp_step)
    for x, y in batches(4, rows=6):
        step(model, opt, T.Tensor(x), y)
    for x, y in batches(4, rows=4):
        step(model, opt, T.Tensor(x), y)
    out = capsys.readouterr().out.splitlines()
    assert out == ["compile: capturing `mlp_step` again: argument 2 has shape (4, 7), the step was captured with "
                   "shape (6, 7)"]
    assert len(step.programs) == 2


def test_a_value_read_mid_step_breaks_the_graph_naming_the_line(capsys):
    torch.manual_seed(0)
    model = GPT.from_torch(TorchGPT(CONFIG).double())
    opt = eager_optimizer(model, TRAIN)
    step = compile_step(eager_step)
    rng = np.random.default_rng(2)
    for _ in range(3):
        loss = step(model, opt, *(rng.integers(0, CONFIG.vocab_size, (2, 8)) for _ in range(2)))
        assert math.isfinite(loss.item())
    (line,) = capsys.readouterr().out.splitlines()
    # chapter 12's clipping (capstone/optim.py) reads the norm with float(), called from the recipe's step
    assert line.startswith("compile: `train_step` runs eagerly: graph break: optim.py:")
    assert " in clip_grad_norm: `norm = " in line and "float(" in line
    assert "(called from trainer.py:" in line and "in train_step: `lib.clip_grad_norm_(" in line
    assert step.stats.eager == 2


def test_a_number_that_changes_between_calls_is_refused_naming_the_line(capsys):
    model, opt = mlp(5, optimizer=T.optim.Adam)
    eager_model, eager_opt = mlp(5, optimizer=T.optim.Adam)
    step = compile_step(mlp_step)
    for x, y in batches(5):
        assert step(model, opt, T.Tensor(x), y).item() == mlp_step(eager_model, eager_opt, T.Tensor(x), y).item()
    (line,) = capsys.readouterr().out.splitlines()
    assert "runs eagerly" in line and "optim.py:" in line and "m_hat = m / (1 - b1 ** t)" in line


def test_dropout_drawn_with_numpy_is_refused(capsys):
    T.manual_seed(6)
    model = T.nn.Sequential(T.nn.Linear(7, 9, dtype=np.float64), T.nn.Dropout(0.3), T.nn.Linear(9, 5, dtype=np.float64))
    opt = capturable.Adam(model.parameters())
    step = compile_step(mlp_step)
    for x, y in batches(4):
        step(model, opt, T.Tensor(x), y)
    (line,) = capsys.readouterr().out.splitlines()
    assert "runs eagerly" in line and "nn.py:" in line and "keep / (1.0 - self.p)" in line


class NumpyClip(Function):
    """An op written in numpy: the compiler cannot see inside it."""

    @staticmethod
    def forward(ctx, a):
        x = a.numpy()
        ctx.mask = np.abs(x) < 1.0
        return T.Tensor(np.clip(x, -1.0, 1.0), dtype=x.dtype).data

    @staticmethod
    def backward(ctx, grad):
        return grad * T.Tensor(ctx.mask.astype(grad.dtype), dtype=grad.dtype)


def clip_step(model, optimizer, x, y):
    loss = T.cross_entropy(NumpyClip.apply(model(x) * 3.0), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def test_an_op_outside_the_backend_runs_as_python_inside_the_compiled_step(capsys):
    model, opt = mlp(7)
    eager_model, eager_opt = mlp(7)
    step = compile_step(clip_step)
    for x, y in batches(8):
        expected = clip_step(eager_model, eager_opt, T.Tensor(x), y).item()
        assert abs(step(model, opt, T.Tensor(x), y).item() - expected) <= 1e-12
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all("NumpyClip" in line and "test_ch13_compiler.py:" in line for line in lines)
    assert step.stats.replays >= 5 and step.program.counts()["island"] == 2


def broken_generator(kernel):
    from course_lib.compiler.answers import pointwise_source
    return pointwise_source(kernel).replace("for j in range(n):", "for j in range(n):\n            q = undefined_name")


def test_a_failing_kernel_shows_its_source_and_its_group():
    model, opt = mlp(8)
    step = compile_step(mlp_step, pieces=Pieces(pointwise=broken_generator), verbose=False)
    with pytest.raises(kernels.KernelError) as failure:
        for x, y in batches(4):
            step(model, opt, T.Tensor(x), y)
    text = str(failure.value)
    assert "failed to compile" in text and "undefined_name" in text and "@njit" in text
    assert "Add.forward" in text or "ReLU" in text


def test_an_index_out_of_range_at_replay_names_the_launch():
    torch.manual_seed(0)
    model = GPT.from_torch(TorchGPT(CONFIG).double())
    opt = recipe_optimizer(model, TRAIN, CAPTURABLE)
    step = compile_step(train_step, verbose=False)
    rng = np.random.default_rng(3)
    for _ in range(4):
        step(model, opt, *(rng.integers(0, CONFIG.vocab_size, (2, 8)) for _ in range(2)), 1.0, CAPTURABLE)
    bad = rng.integers(0, CONFIG.vocab_size, (2, 8))
    bad[1, 3] = CONFIG.vocab_size + 5
    with pytest.raises(kernels.KernelError, match="gather"):
        step(model, opt, bad, bad, 1.0, CAPTURABLE)


def test_state_changed_between_calls_is_taken_in():
    model, opt = mlp(9)
    eager_model, eager_opt = mlp(9)
    step = compile_step(mlp_step, verbose=False)
    data = batches(8)
    for x, y in data[:4]:
        step(model, opt, T.Tensor(x), y)
        mlp_step(eager_model, eager_opt, T.Tensor(x), y)
    weights = {k: v * 0.5 for k, v in eager_model.state_dict().items()}
    model.load_state_dict(weights)
    eager_model.load_state_dict(weights)
    for x, y in data[4:]:
        assert abs(step(model, opt, T.Tensor(x), y).item() - mlp_step(eager_model, eager_opt, T.Tensor(x), y).item()) <= 1e-12
    assert len(step.programs) == 1


def test_the_capturable_optimizers_match_the_librarys():
    model, opt = mlp(10, optimizer=T.optim.Adam)
    model2, opt2 = mlp(10, optimizer=capturable.Adam)
    for x, y in batches(5):
        a = mlp_step(model, opt, T.Tensor(x), y).item()
        b = mlp_step(model2, opt2, T.Tensor(x), y).item()
        assert abs(a - b) <= 1e-12
    opt2.lr = 0.5
    assert float(opt2.lr.item()) == 0.5 and isinstance(opt2.lr, T.Tensor)


def test_chapter_12s_assembly_of_the_courses_pieces_compiles_without_islands(workspace, capsys):
    """Chapter 12's assembly with nothing saved puts the course's Functions in through the op registry: the
    tracer knows them, so the embedding is gathered and scattered by index kernels and cross_entropy's
    one-hot is made from the targets. No island, and the step equals the eager one. (The learner's numpy
    backwards, islands: test_yours_ch13.)"""
    from course_lib.yours import ch12_capstone as capstone

    parts = capstone.assemble(quiet=True)
    torch.manual_seed(4)
    reference = TorchGPT(CONFIG).double()
    eager_model, model = parts.GPT.from_torch(reference), parts.GPT.from_torch(reference)
    eager_opt, opt = recipe_optimizer(eager_model, TRAIN, CAPTURABLE), recipe_optimizer(model, TRAIN, CAPTURABLE)
    step = compile_step(train_step)
    rng = np.random.default_rng(5)
    with parts.running():
        for _ in range(5):
            x, y = (rng.integers(0, CONFIG.vocab_size, (2, 7)) for _ in range(2))
            expected = train_step(eager_model, eager_opt, x, y, 1.0, CAPTURABLE).item()
            assert abs(step(model, opt, x, y, 1.0, CAPTURABLE).item() - expected) <= 1e-12
    assert "works outside the backend" not in capsys.readouterr().out
    counts = step.program.counts()
    assert step.stats.replays == 2 and "island" not in counts and counts["index"] == 4   # gathers, scatter-adds


def test_the_recipes_loop_trains_on_the_capturable_library_as_on_the_courses():
    """gpt.trainer.train with lib=CAPTURABLE: the schedule reaches the optimizer's learning-rate tensor through
    the Library's set_lr, and the losses are those of chapter 12's library (its AdamW in numpy, clipping that
    reads the norm)."""
    from course_lib.gpt import make_get_batch
    from course_lib.gpt.trainer import train

    cfg = TrainConfig(max_iters=6, lr=3e-3, warmup_iters=2, lr_decay_iters=6, eval_interval=0, eval_iters=1,
                      batch_size=2)
    tokens = torch.from_numpy(np.random.default_rng(0).integers(0, CONFIG.vocab_size, 300))
    torch.manual_seed(5)
    reference = TorchGPT(CONFIG).double()
    histories = {}
    for lib in (COURSE, CAPTURABLE):
        model = GPT.from_torch(reference)
        histories[lib.name] = train(model, make_get_batch(tokens, 8, 2, seed=1), cfg, progress=False, lib=lib)
    course, capturable_ = (np.array(histories[lib.name]["loss"]) for lib in (COURSE, CAPTURABLE))
    np.testing.assert_allclose(capturable_, course, rtol=1e-10)
    assert histories[CAPTURABLE.name]["lr"] == [lr_at(it, cfg) for it in range(6)]
