"""Chapter 11's library: the ring, DDP, ZeRO-1, tensor parallelism and the GPT runs, against one process.

Starting workers costs a fork each (from a server that preloaded torch), but the first launch of a test
run pays for the server, so each world size is launched once (a module fixture) and runs every case; the
tests then read their part of the results. The checks' tests (test_ch11_checks.py) prove the checks
reject wrong implementations; these prove the course's own are right, and that launch cleans up.
"""

import ast
import math
import multiprocessing

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from course_lib.distributed import WorkerError, collectives, cost, faults, launch, problems, timing, train
from course_lib.distributed.ddp import DDP, make_buckets
from course_lib.distributed.launch import run_all
from course_lib.distributed.tensor_parallel import ParallelMLP, my_slice
from course_lib.distributed.timing import state_numbers
from course_lib.distributed.zero import ZeroOptimizer
from course_lib.gpt.model import MLP, GPTConfig

LENGTHS = [1, 2, 5, 7, 64, 1001]   # shorter than p, not multiples of p, and one long
STEPS = 3
BUCKETS = (0, 200, 2**20)


# ---- what the workers run ------------------------------------------------------------------------

def ring_input(n, rank, seed=3):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed * 100_003 + n * 17 + rank), dtype=torch.float64)


def ring_job():
    out = [collectives.ring_all_reduce(ring_input(n, dist.get_rank())) for n in LENGTHS]
    square = ring_input(35, dist.get_rank()).view(5, 7)
    column = square[:, 2]                                     # not contiguous: summed through a copy
    collectives.ring_all_reduce(column)
    return out, square


def toy_training(wrap, steps=STEPS, rows=12, accumulate_at=1):
    """Train the toy model on this rank's slice with `wrap(model)` -> (forward, finish, no_sync); one step in
    two micro-batches. Returns the final parameters."""
    model = problems.toy_model(dist.get_rank())            # a different start on every rank
    forward, finish, no_sync = wrap(model)
    opt = problems.toy_optimizer(model.parameters(), "sgd")
    for step in range(steps):
        x, y = (problems.mine(t) for t in problems.toy_batch(step, rows))
        opt.zero_grad()
        halves = list(zip(x.tensor_split(2), y.tensor_split(2))) if step == accumulate_at else [(x, y)]
        for k, (xk, yk) in enumerate(halves):
            with no_sync() if k < len(halves) - 1 else torch.enable_grad():
                (F.mse_loss(forward(xk), yk) / len(halves)).backward()
        finish()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def ddp_job():
    out = {}
    for bucket_bytes in BUCKETS:
        def ours(model, bucket_bytes=bucket_bytes):
            sent, box = [], []   # buckets already sent when the first layer's weight lands (this hook runs before DDP's)
            model[0].weight.register_post_accumulate_grad_hook(lambda _: sent.append(len(box[0].inflight)))
            box.append(DDP(model, bucket_bytes))
            out[f"sent {bucket_bytes}"] = (sent, len(box[0].buckets))
            return box[0], box[0].finish, box[0].no_sync
        out[bucket_bytes] = toy_training(ours)

    def theirs(model):
        ddp = DistributedDataParallel(model)
        return ddp, lambda: None, ddp.no_sync
    out["torch"] = toy_training(theirs)
    return out


def zero_job():
    out = {}
    for name, cls, hyper in (("AdamW", torch.optim.AdamW, dict(lr=0.05, weight_decay=0.1)),
                             ("SGD", torch.optim.SGD, dict(lr=0.1, momentum=0.9))):
        model = problems.toy_model(0)
        opt = ZeroOptimizer(model.parameters(), cls, **hyper)
        for step in range(STEPS):
            x, y = problems.toy_batch(step, 6)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
        out[name] = ([t.detach().clone() for t in model.parameters()], state_numbers([opt.optimizer]))
    torch.manual_seed(5)
    tiny = torch.nn.Linear(1, 1).double()                   # N = 2 numbers: with p = 3, rank 2's shard is empty
    opt = ZeroOptimizer(tiny.parameters(), torch.optim.AdamW, lr=0.1)
    tiny(torch.ones(1, 1, dtype=torch.float64)).sum().backward()
    opt.step()
    out["tiny"] = ([t.detach().clone() for t in tiny.parameters()], state_numbers([opt.optimizer]))
    return out


def tp_input(n_embd=12, seed=0):
    torch.manual_seed(seed)
    mlp = MLP(GPTConfig(n_embd=n_embd)).double()
    x = torch.randn(3, 5, n_embd, dtype=torch.float64)
    w = torch.randn(3, 5, n_embd, dtype=torch.float64)
    return mlp, x, w


def tp_job():
    mlp, x, w = tp_input()
    tp = ParallelMLP(mlp)
    x.requires_grad_(True)
    out = tp(x)
    (out * w).sum().backward()
    return {"out": out.detach(), "x.grad": x.grad, "slice": (tp.lo, tp.hi),
            "grads": [t.grad for t in (tp.c_fc.weight, tp.c_fc.bias, tp.c_proj.weight, tp.c_proj.bias)]}


PIECES = {"ring_all_reduce": collectives.ring_all_reduce, "DDP": DDP, "ZeroOptimizer": ZeroOptimizer,
          "ParallelMLP": ParallelMLP}
TINY = dict(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=16)


def children():
    """This process's children, but for multiprocessing's helpers (its resource tracker and fork server)."""
    try:
        import psutil
    except ImportError:
        return multiprocessing.active_children()
    helpers = ("resource_tracker", "forkserver")
    return [c for c in psutil.Process().children(recursive=True) if not any(h in " ".join(c.cmdline()) for h in helpers)]


def run(world_size, cases):
    per_rank = launch(run_all, world_size, list(cases.values()), timeout=30, wall_timeout=240)
    assert not children(), "a worker outlived its launch"
    return {name: [results[i] for results in per_rank] for i, name in enumerate(cases)}


CASES = {"ring": (ring_job, {}), "ddp": (ddp_job, {}), "zero": (zero_job, {}), "tp": (tp_job, {})}


@pytest.fixture(scope="module")
def at2():
    return run(2, CASES | {"gpt": (train.all_three, dict(steps=STEPS, pieces=PIECES)),
                           "timing": (timing.time_collectives, dict(fns={"ring": collectives.ring_all_reduce,
                                                                         "gloo": dist.all_reduce},
                                                                    lengths=[5, 300], repeats=2)),
                           "state bytes": (timing.optimizer_state_bytes, dict(zero_class=ZeroOptimizer, config=TINY)),
                           "ddp steps": (timing.ddp_step_times, dict(ddp_class=DDP, bucket_sizes=[0, 2**20], steps=3,
                                                                     rows=2, config=TINY))})


@pytest.fixture(scope="module")
def at3():
    return run(3, CASES)


@pytest.fixture(params=[2, 3])
def world(request, at2, at3):
    return request.param, {2: at2, 3: at3}[request.param]


def max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in b)


# ---- no processes: the schedule, the cost, the buckets, the slices ---------------------------------

@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_ring_schedule_completes_one_chunk_per_rank_then_all(p):
    steps = cost.ring_schedule(p)
    assert len(steps) == 1 + 2 * (p - 1)
    everyone = tuple(range(p))
    after_rs = steps[p - 1]["held"]
    for r in range(p):
        assert after_rs[r][(r + 1) % p] == everyone                 # each rank completed one chunk
        assert sum(c == everyone for c in after_rs[r]) == 1
        assert all(c == everyone for c in steps[-1]["held"][r])    # and then holds them all
    for s in steps[1:]:
        assert sorted(s["sent"]) == list(range(p))                  # every chunk on the move, once per step
    for phase in ("reduce-scatter", "all-gather"):                  # the paper schedule is the ring's own
        for s in (s for s in steps if s["phase"] == phase):
            assert s["sent"] == [collectives.chunk_sent(phase, r, s["step"], p) for r in range(p)]


@pytest.mark.parametrize("p", [2, 3, 8])
def test_ring_bytes_stay_below_twice_the_tensor(p):
    assert cost.ring_bytes(1000, p) == pytest.approx(2 * (p - 1) * 1000 / p)
    assert cost.ring_bytes(1000, p) < 2000


def test_the_fit_recovers_latency_and_bandwidth_and_never_collapses():
    n = np.array([2.0**k for k in range(6, 23, 2)])
    t = 2 * 50e-6 + 2 * n / 1e9
    latency, bandwidth = cost.fit(np.full(len(n), 2), 2 * n, t * np.random.default_rng(0).uniform(0.9, 1.1, len(n)))
    assert latency == pytest.approx(50e-6, rel=0.3) and bandwidth == pytest.approx(1e9, rel=0.3)
    flat = np.full(len(n), 1e-3)                                    # times that do not grow: no bandwidth
    assert cost.fit(np.full(len(n), 2), 2 * n, flat)[1] is None
    for bad in (0, len(n) - 1):                                     # one timing far off: never a nonsense figure
        noisy = t.copy()
        noisy[bad] = t[-1] if bad == 0 else t[0]
        latency, bandwidth = cost.fit(np.full(len(n), 2), 2 * n, noisy)
        assert 0 <= latency < t.max() and (bandwidth is None or 1e8 < bandwidth < 1e10)


def test_the_timeline_waits_for_the_bucket_and_for_the_one_before():
    alpha, beta = 1e-3, 1e6                                          # 1 ms per message, 1 MB/s
    one = cost.ring_seconds(1000, 2, alpha, beta)                    # 2 ms + 1 ms
    assert cost.overlapped_seconds([(0.0, 1000)], 2, alpha, beta) == pytest.approx(one)
    assert cost.overlapped_seconds([(0.010, 1000)], 2, alpha, beta) == pytest.approx(0.010 + one)   # waits to be ready
    assert cost.overlapped_seconds([(0.0, 1000), (0.001, 1000)], 2, alpha, beta) == pytest.approx(2 * one)   # queues
    assert cost.overlapped_seconds([], 2, alpha, beta) == 0.0


def test_buckets_close_at_the_size_and_keep_the_order():
    params = [torch.empty(n, dtype=torch.float64) for n in (5, 13, 65, 78, 3)]
    assert [len(b) for b in make_buckets(params, 0)] == [1] * 5
    assert [len(b) for b in make_buckets(params, 200)] == [3, 1, 1]     # 40 + 104 + 520 bytes, then 624, then 24
    assert [len(b) for b in make_buckets(params, 10**9)] == [5]
    assert [p for b in make_buckets(params, 200) for p in b] == params
    assert [len(b) for b in make_buckets(params, 40 + 104)] == [2, 1, 1, 1]   # exactly bucket_bytes: full


@pytest.mark.parametrize("n, p", [(64, 3), (7, 2), (5, 4), (2, 3)])
def test_slices_tile_the_features_like_tensor_split(n, p):
    sizes = [len(c) for c in torch.arange(n).tensor_split(p)]
    slices = [my_slice(n, r, p) for r in range(p)]
    assert [hi - lo for lo, hi in slices] == sizes
    assert all(a[1] == b[0] for a, b in zip(slices, slices[1:])) and slices[-1][1] == n


# ---- the ring ---------------------------------------------------------------------------------

def test_ring_all_reduce_equals_the_sum(world):
    p, results = world
    for rank in range(p):
        vectors, square = results["ring"][rank]
        for n, ring in zip(LENGTHS, vectors):
            torch.testing.assert_close(ring, sum(ring_input(n, r) for r in range(p)), rtol=1e-12, atol=1e-12)
        expected = ring_input(35, rank).view(5, 7)
        expected[:, 2] = sum(ring_input(35, r).view(5, 7)[:, 2] for r in range(p))
        torch.testing.assert_close(square, expected, rtol=1e-12, atol=1e-12)   # only the column changed


@pytest.mark.slow   # four more processes
def test_ring_all_reduce_at_world_size_4():
    vectors, _ = launch(ring_job, 4, timeout=30, wall_timeout=120)[1]
    for n, ring in zip(LENGTHS, vectors):
        torch.testing.assert_close(ring, sum(ring_input(n, r) for r in range(4)), rtol=1e-12, atol=1e-12)


# ---- DDP -------------------------------------------------------------------------------------

def one_process(steps=STEPS, rows=12):
    model = problems.toy_model(0)
    opt = problems.toy_optimizer(model.parameters(), "sgd")
    for step in range(steps):
        x, y = problems.toy_batch(step, rows)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_ddp_equals_one_process_and_torch_ddp_with_accumulation(world):
    p, results = world
    reference = one_process()
    for rank in range(p):
        ours = results["ddp"][rank]
        for variant in (*BUCKETS, "torch"):
            assert max_diff(ours[variant], reference) < 1e-10, f"bucket {variant}, rank {rank}"


def test_ddp_sends_buckets_while_backward_runs(world):
    p, results = world
    for rank in range(p):
        flight = results["ddp"][rank]
        # buckets already sent when model[0].weight (among the last gradients) lands, at the first step
        assert flight["sent 0"][0][0] >= 2 and flight["sent 0"][1] == 4   # one bucket per tensor: the last layer's went
        assert flight["sent 200"][0][0] == 1 and flight["sent 200"][1] == 2   # the last layer's bucket went
        assert flight[f"sent {2**20}"][0][0] == 0 and flight[f"sent {2**20}"][1] == 1   # one bucket: only at the end


# ---- ZeRO-1 -----------------------------------------------------------------------------------

def test_zero_equals_the_optimizer_and_splits_its_state(world):
    p, results = world
    for name, kind, per in (("AdamW", "adamw", 2), ("SGD", "sgd", 1)):
        reference = problems.train_toy(STEPS, optimizer=kind)
        n = sum(t.numel() for t in reference.values())
        for rank in range(p):
            params, state = results["zero"][rank][name]
            assert max(abs(a - b).max().item() for a, b in zip(params, reference.values())) < 1e-10
            lo, hi = min(rank * math.ceil(n / p), n), min((rank + 1) * math.ceil(n / p), n)
            assert state == per * (hi - lo)                          # its own shard's state, nothing more
        assert sum(results["zero"][r][name][1] for r in range(p)) == per * n   # together: one optimizer's


def test_zero_survives_an_empty_shard(world):
    p, results = world
    torch.manual_seed(5)
    tiny = torch.nn.Linear(1, 1).double()
    first = [t.detach().clone() for t in tiny.parameters()]
    for rank in range(p):
        params, state = results["zero"][rank]["tiny"]
        assert state == (2 if rank < 2 else 0)                      # N = 2: p = 3 leaves rank 2 nothing
        assert all(not torch.equal(a, b) for a, b in zip(params, first))   # every number was updated by its owner
    assert all(torch.equal(a, b) for r in results["zero"] for a, b in zip(r["tiny"][0], results["zero"][0]["tiny"][0]))


# ---- tensor parallelism -----------------------------------------------------------------------

def test_tensor_parallel_mlp_equals_the_mlp(world):
    p, results = world
    mlp, x, w = tp_input()
    x.requires_grad_(True)
    out = mlp(x)
    (out * w).sum().backward()
    for rank in range(p):
        result = results["tp"][rank]
        lo, hi = result["slice"]
        torch.testing.assert_close(result["out"], out.detach(), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(result["x.grad"], x.grad, rtol=1e-10, atol=1e-12)
        for yours, expected in zip(result["grads"], (mlp.c_fc.weight.grad[lo:hi], mlp.c_fc.bias.grad[lo:hi],
                                                     mlp.c_proj.weight.grad[:, lo:hi], mlp.c_proj.bias.grad)):
            torch.testing.assert_close(yours, expected, rtol=1e-10, atol=1e-12)


# ---- the chapter 04 GPT, the benchmarks' workers ------------------------------------------------

def test_the_gpt_on_two_processes_has_the_losses_of_one(at2):
    reference = problems.train_gpt(STEPS)
    assert reference[-1] < reference[0]
    for runs in at2["gpt"]:
        assert set(runs) == {"ring", "ddp + zero", "tensor parallel"}
        for losses in runs.values():
            assert max(abs(a - b) for a, b in zip(losses, reference)) < 1e-12


def test_the_benchmark_workers_run(at2):
    for rows in at2["timing"]:
        assert [r["n"] for r in rows] == [5, 300] and all(r["ring"] > 0 and r["gloo"] > 0 for r in rows)
    ours, full = at2["state bytes"][0]
    assert 2 * ours in (full, full + 8)                              # half of AdamW's, float32 (N may be odd)
    assert set(at2["ddp steps"][0]) == {0, 2**20, "torch DDP"}


# ---- the supervisor -----------------------------------------------------------------------------

def test_a_killed_worker_is_named_and_no_process_remains():
    with pytest.raises(WorkerError) as info:
        launch(faults.fail_at_step, 2, 1, 2, "kill", timeout=30, wall_timeout=120)
    assert info.value.rank == 1 and "SIGKILL" in str(info.value)
    assert not children()


def test_a_raising_worker_is_named_with_its_error_and_traceback():
    with pytest.raises(WorkerError) as info:
        launch(faults.fail_at_step, 2, 0, 1, "raise", timeout=30, wall_timeout=120)
    assert info.value.rank == 0
    assert "ValueError: rank 0 gives up at step 1" in str(info.value) and "Traceback" in str(info.value)
    assert not children()


def test_a_hanging_worker_ends_in_the_others_timeout():
    with pytest.raises(WorkerError) as info:
        launch(faults.fail_at_step, 2, 1, 1, "hang", timeout=2, wall_timeout=120)
    assert info.value.rank == 0 and "timed out" in str(info.value).lower() and info.value.running == [1]
    assert not children()


# ---- the lesson runs none of the answers ---------------------------------------------------------

ANSWERS = {f"course_lib.distributed.{m}" for m in ("collectives", "ddp", "zero", "tensor_parallel", "train")}


def module_imports(name):
    """The course_lib modules that module `name` imports when it is imported (top level, not inside functions)."""
    from course_lib import PACKAGE_DIR

    parts = name.split(".")[1:]
    path = PACKAGE_DIR.joinpath(*parts).with_suffix(".py")
    if not path.exists():
        path = PACKAGE_DIR.joinpath(*parts, "__init__.py")
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_lib"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("course_lib"))
    return {m for m in found if _is_module(m)}


def _is_module(name):
    from course_lib import PACKAGE_DIR

    parts = name.split(".")[1:]
    return PACKAGE_DIR.joinpath(*parts).with_suffix(".py").exists() or PACKAGE_DIR.joinpath(*parts, "__init__.py").exists()


def test_the_lesson_imports_none_of_the_course_answers_to_its_exercises():
    """Lesson 11 comes before every chapter 11 exercise: what it imports must not load the course's ring, DDP,
    ZeRO-1, f and g or MLP (importing a package runs its __init__, and a module runs its own imports)."""
    from course_lib import REPO_DIR
    from course_lib.course import nbtools

    todo = set()
    for cell in nbtools.read(REPO_DIR / "notebooks" / "11_distributed.ipynb").cells:
        if cell.cell_type == "code":
            todo |= {m for n in ast.walk(ast.parse(cell.source)) if isinstance(n, (ast.Import, ast.ImportFrom))
                     for m in ([n.module] if isinstance(n, ast.ImportFrom) else [a.name for a in n.names])
                     if m and m.startswith("course_lib")}
    seen = set()
    while todo:
        name = todo.pop()
        parents = {".".join(name.split(".")[:k]) for k in range(2, name.count(".") + 1)}
        for module in {name} | parents:
            if module not in seen:
                seen.add(module)
                todo |= module_imports(module)
    assert not seen & ANSWERS, f"lesson 11 loads {sorted(seen & ANSWERS)}"
