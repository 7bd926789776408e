"""Chapter 11: ring all-reduce, DDP, ZeRO-1 and tensor parallelism on gloo processes, against one process.

Starting processes costs seconds, so each world size is launched once (a module fixture) and runs
every case, the wrong implementations included; the tests then read their part of the results.
The wrong implementations are written as a learner would write them in a notebook, and travel to the
workers as source (`Code.of`), the way the chapter's checks will carry a learner's code.
"""

import math
import multiprocessing

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.distributed import Code, WorkerError, launch
from course_lib.distributed import workers as w
from course_lib.distributed.collectives import ring_bytes, ring_schedule
from course_lib.distributed.ddp import DDP, make_buckets
from course_lib.distributed.tensor_parallel import ColumnParallelLinear, RowParallelLinear, my_slice
from course_lib.distributed.zero import ZeroAdamW

LENGTHS = [1, 2, 5, 7, 64, 1001]   # shorter than p, not multiples of p, and one long
STEPS = 3


def notebook(obj):
    """Mark obj as typed in a notebook (module __main__), so that only its source can reach the workers."""
    obj.__module__ = "__main__"
    return obj


@notebook
def averaging_all_reduce(tensor):
    dist.all_reduce(tensor)
    return tensor.div_(dist.get_world_size())   # the mean, where all-reduce means the sum


@notebook
class AveragedTwice(DDP):
    def _launch(self, i):
        for p in self.buckets[i]:
            p.grad /= self.world_size        # averages here, and finish() averages again
        super()._launch(i)


@notebook
class FlushedEarly(DDP):
    def _ready(self, i):
        return self.arrived[i] >= len(self.buckets[i]) - 1   # goes before its last gradient lands


@notebook
class ShardOffByOne(ZeroAdamW):
    def bounds(self, rank):
        lo = min(rank * self.shard, self.numel)
        return lo, min((rank + 1) * self.shard - 1, self.numel)   # an inclusive end: one number per shard never updated


@notebook
class ColumnWithoutF(ColumnParallelLinear):
    def forward(self, x):
        return F.linear(x, self.weight, self.bias)   # no f: x's gradient misses the other ranks' parts


@notebook
class RowWithoutG(RowParallelLinear):
    def forward(self, x_slice):
        return F.linear(x_slice, self.weight) + self.bias   # no g: each rank keeps its partial sum


def code(obj):
    return Code.of(obj, globals())


CASES = {
    "ring": (w.ring_matches_all_reduce, dict(lengths=LENGTHS, seed=3)),
    "ring averaging": (w.ring_matches_all_reduce, dict(lengths=LENGTHS, seed=3, ring=code(averaging_all_reduce))),
    "ddp": (w.ddp_matches, dict(steps=STEPS)),
    "ddp averaged twice": (w.ddp_matches, dict(steps=STEPS, bucket_sizes=(200,), ddp_class=code(AveragedTwice),
                                               with_torch=False)),
    "ddp flushed early": (w.ddp_matches, dict(steps=STEPS, bucket_sizes=(200,), ddp_class=code(FlushedEarly),
                                              with_torch=False)),
    "zero": (w.zero_matches, dict(steps=STEPS)),
    "zero shard off by one": (w.zero_matches, dict(steps=STEPS, zero_class=code(ShardOffByOne))),
    "tp": (w.tp_mlp_matches, {}),
    "tp without f": (w.tp_mlp_matches, dict(column=code(ColumnWithoutF))),
    "tp without g": (w.tp_mlp_matches, dict(row=code(RowWithoutG))),
}
GPT_CASES = {
    "gpt": (w.gpt_data_parallel, dict(steps=STEPS)),
    "gpt zero": (w.gpt_data_parallel, dict(steps=STEPS, zero=True)),
}


def children():
    """This process's children, but for multiprocessing's resource tracker (one per parent, kept for its life)."""
    try:
        import psutil
    except ImportError:
        return multiprocessing.active_children()
    return [c for c in psutil.Process().children(recursive=True) if "resource_tracker" not in " ".join(c.cmdline())]


def run(world_size, cases):
    per_rank = launch(w.run_all, world_size, list(cases.values()), timeout=30, wall_timeout=240)
    assert not children(), "a worker outlived its launch"
    return {name: [results[i] for results in per_rank] for i, name in enumerate(cases)}


@pytest.fixture(scope="module")
def at2():
    return run(2, CASES | GPT_CASES)


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
    steps = ring_schedule(p)
    assert len(steps) == 1 + 2 * (p - 1)
    everyone = tuple(range(p))
    after_rs = steps[p - 1]["held"]
    for r in range(p):
        assert after_rs[r][(r + 1) % p] == everyone                 # each rank completed one chunk
        assert sum(c == everyone for c in after_rs[r]) == 1
        assert all(c == everyone for c in steps[-1]["held"][r])    # and then holds them all
    for s in steps[1:]:
        assert sorted(s["sent"]) == list(range(p))                  # every chunk on the move, once per step


@pytest.mark.parametrize("p", [2, 3, 8])
def test_ring_bytes_stay_below_twice_the_tensor(p):
    assert ring_bytes(1000, p) == pytest.approx(2 * (p - 1) * 1000 / p)
    assert ring_bytes(1000, p) < 2000


def test_buckets_close_at_the_size_and_keep_the_order():
    params = [torch.empty(n, dtype=torch.float64) for n in (5, 13, 65, 78, 3)]
    assert [len(b) for b in make_buckets(params, 0)] == [1] * 5
    assert [len(b) for b in make_buckets(params, 200)] == [3, 1, 1]     # 40 + 104 + 520 bytes, then 624, then 24
    assert [len(b) for b in make_buckets(params, 10**9)] == [5]
    assert [p for b in make_buckets(params, 200) for p in b] == params


@pytest.mark.parametrize("n, p", [(64, 3), (7, 2), (5, 4), (2, 3)])
def test_slices_tile_the_features_like_tensor_split(n, p):
    sizes = [len(c) for c in torch.arange(n).tensor_split(p)]
    slices = [my_slice(n, r, p) for r in range(p)]
    assert [hi - lo for lo, hi in slices] == sizes
    assert all(a[1] == b[0] for a, b in zip(slices, slices[1:])) and slices[-1][1] == n


# ---- the ring ---------------------------------------------------------------------------------

def test_ring_all_reduce_equals_the_sum_and_dist_all_reduce(world):
    p, results = world
    for i, n in enumerate(LENGTHS):
        expected = sum(w.ring_input(n, r, seed=3) for r in range(p))     # the parent's own sum
        for rank in range(p):
            ring, theirs = results["ring"][rank][i]
            torch.testing.assert_close(ring, expected, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(theirs, expected, rtol=1e-12, atol=1e-12)


def test_an_all_reduce_that_averages_is_caught(world):
    p, results = world
    for i, n in enumerate(LENGTHS):
        expected = sum(w.ring_input(n, r, seed=3) for r in range(p))
        assert all((r[i][0] - expected).abs().max() > 1e-3 for r in results["ring averaging"])


@pytest.mark.slow   # four more processes: about 10 s on two loaded cores
def test_ring_all_reduce_at_world_size_4():
    per_rank = launch(w.ring_matches_all_reduce, 4, [3, 10, 257], 5, timeout=30, wall_timeout=120)
    for i, n in enumerate([3, 10, 257]):
        expected = sum(w.ring_input(n, r, seed=5) for r in range(4))
        for ring, theirs in (results[i] for results in per_rank):
            torch.testing.assert_close(ring, expected, rtol=1e-12, atol=1e-12)


# ---- DDP -------------------------------------------------------------------------------------

def test_ddp_equals_one_process_on_the_global_batch_and_torch_ddp(world):
    p, results = world
    reference = w.train_toy(STEPS)
    for rank in range(p):
        ours = results["ddp"][rank]["params"]
        assert set(ours) == {0, 200, 2**20, "torch"}
        for variant, params in ours.items():
            assert max_diff(params, reference) < 1e-10, f"bucket {variant}, rank {rank}"
            assert max_diff(params, ours["torch"]) < 1e-10


def test_ddp_sends_buckets_while_backward_runs(world):
    p, results = world
    for rank in range(p):
        flight = results["ddp"][rank]["in flight"]
        # (sent when the first layer's weight gets its gradient, sent when backward returns, buckets)
        assert flight[0][0] >= 2 and flight[0][1:] == (4, 4)   # one bucket per tensor: the second layer's went
        assert flight[200] == (1, 2, 2)                        # two buckets of two tensors: the second layer's went
        assert flight[2**20] == (0, 1, 1)                      # one bucket: it can only go at the end


@pytest.mark.parametrize("wrong", ["ddp averaged twice", "ddp flushed early"])
def test_wrong_ddp_is_caught(world, wrong):
    p, results = world
    reference = w.train_toy(STEPS)
    for rank in range(p):
        assert max_diff(results[wrong][rank]["params"][200], reference) > 1e-4


# ---- ZeRO-1 -----------------------------------------------------------------------------------

def test_zero_equals_adamw_and_splits_its_state(world):
    p, results = world
    reference = w.train_toy(STEPS, optimizer="adamw")
    n = sum(t.numel() for t in reference.values())
    for rank in range(p):
        params, state_bytes = results["zero"][rank]
        assert max_diff(params, reference) < 1e-10
        lo, hi = min(rank * math.ceil(n / p), n), min((rank + 1) * math.ceil(n / p), n)
        assert state_bytes == 2 * (hi - lo) * 8                  # m and v of this rank's shard, float64
    assert sum(b for _, b in results["zero"]) == 2 * n * 8       # together: one AdamW's state, no copies


def test_zero_shard_off_by_one_is_caught(world):
    p, results = world
    reference = w.train_toy(STEPS, optimizer="adamw")
    assert all(max_diff(params, reference) > 1e-4 for params, _ in results["zero shard off by one"])


# ---- tensor parallelism -----------------------------------------------------------------------

def tp_reference():
    mlp, x, weight = w.tp_input()
    x.requires_grad_(True)
    out = mlp(x)
    (out * weight).sum().backward()
    return mlp, out.detach(), x.grad


def tp_errors(result, mlp, out, x_grad):
    """The largest difference of the output, of x's gradient and of the parameters' gradient slices."""
    lo, hi, wg, bg = result["c_fc"]
    lo2, hi2, wg2, bg2 = result["c_proj"]
    return {"out": (result["out"] - out).abs().max().item(),
            "x.grad": (result["x.grad"] - x_grad).abs().max().item(),
            "params": max((wg - mlp.c_fc.weight.grad[lo:hi]).abs().max().item(),
                          (bg - mlp.c_fc.bias.grad[lo:hi]).abs().max().item(),
                          (wg2 - mlp.c_proj.weight.grad[:, lo2:hi2]).abs().max().item(),
                          (bg2 - mlp.c_proj.bias.grad).abs().max().item())}


def test_tensor_parallel_mlp_equals_the_mlp(world):
    p, results = world
    reference = tp_reference()
    for rank in range(p):
        assert all(e < 1e-10 for e in tp_errors(results["tp"][rank], *reference).values())


def test_tensor_parallel_without_an_all_reduce_is_caught(world):
    p, results = world
    reference = tp_reference()
    without_f = [tp_errors(r, *reference) for r in results["tp without f"]]
    assert all(e["out"] < 1e-10 and e["params"] < 1e-10 and e["x.grad"] > 1e-4 for e in without_f)  # only x.grad shows it
    assert all(tp_errors(r, *reference)["out"] > 1e-4 for r in results["tp without g"])


# ---- the chapter 04 GPT ------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["gpt", "gpt zero"])
def test_gpt_on_two_processes_has_the_losses_of_one(at2, case):
    reference = w.train_gpt(STEPS)
    assert reference[-1] < reference[0]
    for losses in at2[case]:
        assert max(abs(a - b) for a, b in zip(losses, reference)) < 1e-10


# ---- the supervisor -----------------------------------------------------------------------------

def test_a_killed_worker_is_named_and_no_process_remains():
    with pytest.raises(WorkerError) as info:
        launch(w.fail_at_step, 2, 1, 2, "kill", timeout=30, wall_timeout=120)
    assert info.value.rank == 1 and "SIGKILL" in str(info.value)
    assert not children()


def test_a_raising_worker_is_named_with_its_error_and_traceback():
    with pytest.raises(WorkerError) as info:
        launch(w.fail_at_step, 2, 0, 1, "raise", timeout=30, wall_timeout=120)
    assert info.value.rank == 0
    assert "ValueError: rank 0 gives up at step 1" in str(info.value) and "Traceback" in str(info.value)
    assert not children()


def test_a_hanging_worker_ends_in_the_others_timeout():
    with pytest.raises(WorkerError) as info:
        launch(w.fail_at_step, 2, 1, 1, "hang", timeout=2, wall_timeout=120)
    assert info.value.rank == 0 and "timed out" in str(info.value).lower() and info.value.running == [1]
    assert not children()
