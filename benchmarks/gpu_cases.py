"""The cases and figures of gpu_verify.py: each CUDA path of the course against PyTorch, and timed.

Cases and figures register with the decorators of gpu_report.py, `@case(group, name)` (fn(env) returns a
Check or raises Skip) and `@figure(group, title, header)` (fn(env, figure) yields table rows); they land
in CASES and FIGURES, which gpu_verify.py runs. Another file of cases is any `gpu_cases_*.py` beside this
one (chapter 10's attention and scan, say): it imports what it needs from gpu_report (and helpers such as
`Env`, `gap`, `worst` from here), and this module imports it at its end, so its cases run after these.

Sizes come in pairs, `env.size(gpu, simulator)`: on a GPU, sizes that fill it and are not multiples
of a block (1,000, 100,003, 257 x 333, ...); on the simulator, tiny ones (it runs about 130 µs per
thread). The oracle is PyTorch in float64 on `env.dev` (the GPU when torch sees one), fed the same
float32 numbers the kernel gets, so every bound below is about the kernel's own float32 arithmetic:

- one rounding (a + 10, a + b, relu):        eps * max|ref|
- a sum of k terms (matmul, row sums, conv):  k * eps * max sum|terms|, the textbook worst case
- the long sums of the dot and the prefix sum (n = 100,003): 4 * eps * n * rms(terms), the size of a
  random walk of roundings over a tree of partial sums; the textbook worst case there is over 700,
  which a kernel that drops a whole block (terms of size about 1) would pass
- math functions (exp, tanh, erf ...):        8 eps relative, with 1 as the floor of the scale
- the fused scan and attention (long chains): 1e-4 * max|ref| (attention: with 1 as the floor); a
  wrong kernel (a missed tile edge, a mask off by one, a lost rescale) is off by far more, and
  float32 keeps about 7 digits
- the chapter 07 scan, in float64:            1e-9 relative

eps is float32's machine epsilon, 1.19e-7.
"""

import math
import statistics
import time
import warnings
import zlib

from course_lib import device

device.setup(verbose=False)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gpu_report import CASES, FIGURES, Check, Skip, case, figure  # noqa: E402, F401
from numba import cuda, float32  # noqa: E402  (after the device is chosen)

from course_lib.cuda import matmul as M  # noqa: E402
from course_lib.cuda import puzzles as P  # noqa: E402
from course_lib.cuda import scan as S07  # noqa: E402
from course_lib.cuda.launch import LaunchError, launch  # noqa: E402
from course_lib.fused import attention_cuda, scan_cuda  # noqa: E402
from course_lib.mamba.scan import selective_scan_sequential  # noqa: E402
from course_lib.tensor import TensorData, scalar_ops  # noqa: E402

EPS = float(np.finfo(np.float32).eps)

# Numba's advice about small grids and host arrays is about speed, and these cases use both on purpose;
# hundreds of such lines would bury the results in a log read from its end.
warnings.filterwarnings("ignore", message=r".*(under-utilization|Host array used in CUDA kernel)")
warnings.filterwarnings("ignore", message=r".*overflow encountered in cast")      # the inf and nan case


class Env:
    """Where this run computes: the simulator or a GPU, and where PyTorch computes the oracle."""

    def __init__(self, simulated, budget):
        self.sim, self.budget = simulated, budget
        self.torch_cuda = torch.cuda.is_available()
        self.dev = torch.device("cuda" if self.torch_cuda else "cpu")

    def size(self, gpu, simulator):
        return simulator if self.sim else gpu

    def rng(self, name):
        return np.random.default_rng(zlib.crc32(name.encode()))

    def sync(self):
        if not self.sim:
            cuda.synchronize()
        if self.torch_cuda:
            torch.cuda.synchronize()

    def t(self, a, dtype=torch.float64):
        """A numpy array as a torch tensor on the oracle's device."""
        return torch.as_tensor(np.asarray(a)).to(self.dev, dtype)


def check_imports():
    """Import what the cases and the lessons' CUDA paths need; return the failures, one line each."""
    failed = []
    for name in ("course_lib.custom_ops.cpp", "course_lib.custom_ops.numba_cuda", "course_lib.cuda.backend",
                 "course_lib.fused.scan_op", "course_lib.fused.attention_op", "course_lib.distributed.launch",
                 "course_lib.distributed.collectives", "course_lib.data", "sklearn.datasets"):
        try:
            __import__(name)
        except Exception as e:   # noqa: BLE001
            failed.append(f"{name}: {type(e).__name__}: {e}")
    return failed


# ---- comparing --------------------------------------------------------------------------------------

def gap(ours, ref):
    """max |ours - ref| as a float; equal infinities and nans in the same places count 0, any other
    non-finite mismatch counts inf."""
    ours, ref = _np(ours), _np(ref)
    if ours.shape != ref.shape:
        raise ValueError(f"shape {ours.shape}, expected {ref.shape}")
    same = (ours == ref) | (np.isnan(ours) & np.isnan(ref))
    with np.errstate(invalid="ignore"):                 # inf - inf: a mismatch, counted as inf below
        diff = np.where(same, 0.0, np.abs(ours - ref))
    diff = np.where(np.isnan(diff), np.inf, diff)
    return float(diff.max()) if diff.size else 0.0


def amax(t):
    """max |t| as a float (0 for an empty array)."""
    a = np.abs(_np(t))
    return float(a.max()) if a.size else 0.0


def _np(t):
    return np.asarray(t.detach().cpu() if isinstance(t, torch.Tensor) else t, dtype=np.float64)


def where(ours, ref):
    """Hint: the index where ours and ref differ most, and the two values there."""
    ours, ref = _np(ours), _np(ref)
    with np.errstate(invalid="ignore"):
        d = np.nan_to_num(np.abs(ours - ref), nan=np.inf)
    i = np.unravel_index(int(np.argmax(d)), d.shape) if d.size else ()
    return f"worst at {tuple(int(v) for v in i)}: {ours[i]:.6g} vs {ref[i]:.6g}" if d.size else ""


def worst(pairs, note=""):
    """One Check from several (name, ours, ref, bound) comparisons: the one furthest over its bound."""
    checks = []
    for name, ours, ref, bound in pairs:
        e = gap(ours, ref)
        checks.append((e / bound if bound else (0 if e == 0 else math.inf), name, e, bound, ours, ref))
    ratio, name, e, bound, ours, ref = max(checks, key=lambda c: c[0])
    text = f"{note}; " if note else ""
    text += f"tightest: {name}" + (f", {where(ours, ref)}" if e > bound else "")
    return Check(e, bound, text)


# ---- 1. the puzzles (chapter 07, course_lib/cuda/puzzles.py) -----------------------------------------

def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def one_rounding(ours, ref, note):
    return Check(gap(ours, ref), EPS * max(1.0, amax(ref)), note)


@case("puzzles", "01 map_add10")
def _(env):
    a = f32(env.rng("map"), env.size(1000, 13))
    return one_rounding(P.map_add10(a), env.t(a) + 10, f"n={a.size}, one block")


@case("puzzles", "02 zip_add")
def _(env):
    rng = env.rng("zip")
    a, b = f32(rng, env.size(1000, 45)), f32(rng, env.size(1000, 45))
    return one_rounding(P.zip_add(a, b), env.t(a) + env.t(b), f"n={a.size}")


@case("puzzles", "03 guard_add10")
def _(env):
    a = f32(env.rng("guard"), env.size(1000, 45))
    return one_rounding(P.guard_add10(a), env.t(a) + 10, f"n={a.size}, {P.blocks_for(a.size, 32) * 32} threads")


@case("puzzles", "04 map2d_add10")
def _(env):
    a = f32(env.rng("map2d"), *env.size((29, 30), (5, 7)))
    return one_rounding(P.map2d_add10(a), env.t(a) + 10, f"shape {a.shape}")


@case("puzzles", "05 broadcast_add")
def _(env):
    rng = env.rng("broadcast")
    n, m = env.size((29, 30), (5, 7))
    a, b = f32(rng, n, 1), f32(rng, 1, m)
    return one_rounding(P.broadcast_add(a, b), env.t(a) + env.t(b), f"({n}, 1) + (1, {m})")


@case("puzzles", "06 blocks_add10")
def _(env):
    a = f32(env.rng("blocks"), env.size(100_003, 45))
    return one_rounding(P.blocks_add10(a), env.t(a) + 10, f"n={a.size}, 8 threads per block")


@case("puzzles", "07 blocks2d_add10")
def _(env):
    a = f32(env.rng("blocks2d"), *env.size((1000, 777), (11, 13)))
    return one_rounding(P.blocks2d_add10(a), env.t(a) + 10, f"shape {a.shape}, blocks (8, 4)")


@case("puzzles", "08 block_reverse")
def _(env):
    a = f32(env.rng("reverse"), env.size(100_003, 75))
    ref = torch.cat([c.flip(0) for c in env.t(a).split(P.TPB)])
    return Check(gap(P.block_reverse(a), ref), 0.0, f"n={a.size}, exact (a permutation)")


@case("puzzles", "09 pool3")
def _(env):
    a = f32(env.rng("pool3"), env.size(100_003, 75))
    t = env.t(a)
    ref = t.clone()
    ref[1:] += t[:-1]
    ref[2:] += t[:-2]
    return Check(gap(P.pool3(a), ref), 3 * EPS * 3 * amax(t), f"n={a.size}, halo of 2")


def rms(t):
    return float(t.pow(2).mean().sqrt())


@case("puzzles", "10 dot")
def _(env):
    rng = env.rng("dot")
    a, b = f32(rng, env.size(100_003, 75)), f32(rng, env.size(100_003, 75))
    ta, tb = env.t(a), env.t(b)
    ref = (ta * tb).sum()
    return Check(gap(P.dot(a, b), ref), 4 * EPS * a.size * rms(ta * tb), f"n={a.size}")


@case("puzzles", "11 conv1d")
def _(env):
    rng = env.rng("conv1d")
    a, w = f32(rng, env.size(100_003, 75)), f32(rng, env.size(7, 5))
    ta, tw = env.t(a), env.t(w)
    ref = F.conv1d(F.pad(ta, (0, w.size - 1)).view(1, 1, -1), tw.view(1, 1, -1)).view(-1)
    return Check(gap(P.conv1d(a, w), ref), w.size * EPS * amax(ta) * float(tw.abs().sum()),
                 f"n={a.size}, K={w.size}")


@case("puzzles", "12 prefix_sum")
def _(env):
    a = f32(env.rng("prefix"), env.size(100_003, 32 * 3 + 5))
    t = env.t(a)
    levels = 1 + sum(1 for k in range(1, 6) if a.size > P.TPB ** k)
    return Check(gap(P.prefix_sum(a), t.cumsum(0)), 4 * EPS * a.size * rms(t),
                 f"n={a.size}, {levels} levels of block sums")


@case("puzzles", "13 row_sum")
def _(env):
    a = f32(env.rng("rowsum"), *env.size((1000, 777), (3, 70)))
    t = env.t(a)
    return Check(gap(P.row_sum(a), t.sum(1)), a.shape[1] * EPS * float(t.abs().sum(1).max()),
                 f"shape {a.shape}")


def _ladder(env):
    """The matmul ladder's kernels: the GPU sizes on a GPU, small tiles on the simulator."""
    return M.small_ladder() if env.sim else M.LADDER


def _matmul_case(step):
    def fn(env):
        rng = env.rng(step)
        n, k, m = env.size((257, 333, 129), (19, 21, 17))
        A, B = f32(rng, n, k), f32(rng, k, m)
        tA, tB = env.t(A), env.t(B)
        C = M.matmul(A, B, step, _ladder(env))
        kernel, block, tile = _ladder(env)[step]
        return Check(gap(C, tA @ tB), k * EPS * float((tA.abs() @ tB.abs()).max()),
                     f"({n}, {k}) @ ({k}, {m}), block {block}, {tile[0]} x {tile[1]} of C per block")
    return fn


for _i, _step in enumerate(M.LADDER):
    case("matmul", f"{14 + _i} {_step}")(_matmul_case(_step))


@case("matmul", "registers and local memory")
def _(env):
    """The dispatcher's own report of each ladder kernel's registers and local memory (spilled arrays).
    A fact, printed: 2D blocking must keep its 64 accumulators in registers (0 bytes of local memory)."""
    if env.sim:
        raise Skip("the dispatcher reports registers only for code compiled for a GPU")
    notes, spilled = [], []
    for step, (kernel, _, _) in M.LADDER.items():
        for sig in kernel.overloads:
            regs, local = kernel.get_regs_per_thread(sig), kernel.get_local_mem_per_thread(sig)
            notes.append(f"{step}: {regs} registers, {local} B local")
            if step == "2D blocking" and local:
                spilled.append(local)
    if not notes:
        raise Skip("no ladder kernel compiled yet (the matmul cases above compile them)")
    if spilled:
        return Check(float(max(spilled)), 0.0, "; ".join(notes) + ": 2D blocking spills its accumulators")
    return Check(status="INFO", note="; ".join(notes))


# ---- 2. the CUDA backend of the tensor engine (course_lib/cuda/backend.py) ----------------------------

def _backend():
    from course_lib.cuda.backend import backend
    return backend


def _torch_map(op, t):
    """What each map op is in torch, on a float64 tensor."""
    erf_part = 0.5 * (1 + torch.erf(t / math.sqrt(2)))
    return {"id": lambda: t, "neg": lambda: -t, "exp": t.exp, "log": t.log, "sqrt": t.sqrt,
            "inv": t.reciprocal, "relu": t.relu, "step": lambda: (t > 0).double(), "sigmoid": t.sigmoid,
            "tanh": t.tanh, "gelu": lambda: F.gelu(t),
            "gelu_grad": lambda: erf_part + t * torch.exp(-0.5 * t * t) / math.sqrt(2 * math.pi)}[op]()


def _torch_zip(op, a, b):
    return {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
            "max": torch.maximum, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
            "gt": torch.gt, "ge": torch.ge}[op](a, b).double()


def _strided(env, name, shape, domain="any"):
    """A float32 TensorData that is a permuted view (strides not row-major), and the same values in torch.

    domain: "any" (uniform in [-2, 2]), "positive" (for log, sqrt, a base of pow), "nonzero" (a divisor)."""
    base = env.rng(name).uniform(-2, 2, shape[::-1])
    if domain == "positive":
        base = np.abs(base) + 0.1
    elif domain == "nonzero":
        base = np.sign(base) * (np.abs(base) + 0.5)
    base = base.astype(np.float32)
    order = tuple(reversed(range(len(shape))))
    return TensorData.from_numpy(base, np.float32).permute(*order), env.t(base).permute(*order)


def _map_case(op):
    def fn(env):
        a, ta = _strided(env, f"map-{op}", env.size((301, 77), (5, 7)), "positive" if op in ("log", "sqrt") else "any")
        ref = _torch_map(op, ta)
        return Check(gap(_backend().map(op, a).to_numpy(), ref), 8 * EPS * max(1.0, amax(ref)),
                     f"shape {a.shape}, permuted view")
    return fn


def _zip_case(op):
    def fn(env):
        a, ta = _strided(env, f"zip-{op}", env.size((2, 301, 77), (2, 3, 5)), "positive" if op == "pow" else "any")
        b, tb = _strided(env, f"zip-b-{op}", env.size((301, 1), (3, 1)), "nonzero" if op == "div" else "any")
        ref = _torch_zip(op, ta, tb)
        tol = 8 * EPS if op == "pow" else EPS
        return Check(gap(_backend().zip(op, a, b).to_numpy(), ref), tol * max(1.0, amax(ref)),
                     f"{a.shape} with {b.shape} broadcast")
    return fn


for _op in scalar_ops.MAP:
    case("backend", f"map {_op}")(_map_case(_op))
for _op in scalar_ops.ZIP:
    case("backend", f"zip {_op}")(_zip_case(_op))


@case("backend", "reduce sum, max")
def _(env):
    rng = env.rng("reduce")
    shape = env.size((19, 33, 45), (5, 4, 6))
    base = TensorData.from_numpy(rng.uniform(-2, 2, shape).astype(np.float32), np.float32)
    # rows 1.. and columns ..3 of the middle dims, as an offset view, then permuted
    sub = (shape[0] - 1, shape[1] - 1, shape[2])
    view = TensorData(base.storage, sub, base.strides, base.offset + base.strides[0]).permute(2, 0, 1)
    tv = env.t(base.to_numpy())[1:, :sub[1], :].permute(2, 0, 1)
    pairs = []
    for dim in range(3):
        pairs.append((f"sum dim {dim}", _backend().reduce("sum", view, dim).to_numpy(), tv.sum(dim, keepdim=True),
                      tv.shape[dim] * EPS * float(tv.abs().sum(dim).max())))
        pairs.append((f"max dim {dim}", _backend().reduce("max", view, dim).to_numpy(), tv.amax(dim, keepdim=True), 0.0))
    return worst(pairs, f"every dim of an offset, permuted view {view.shape}")


@case("backend", "matmul batched, broadcast")
def _(env):
    rng = env.rng("bmm")
    sa, sb = env.size(((2, 1, 67, 45), (3, 45, 33)), ((2, 1, 7, 19), (3, 19, 5)))
    a, b = rng.uniform(-2, 2, sa).astype(np.float32), rng.uniform(-2, 2, sb).astype(np.float32)
    ta, tb = env.t(a), env.t(b)
    ours = _backend().matmul(TensorData.from_numpy(a, np.float32), TensorData.from_numpy(b, np.float32))
    k = sa[-1]
    return Check(gap(ours.to_numpy(), ta @ tb), k * EPS * float((ta.abs() @ tb.abs()).max()), f"{sa} @ {sb}")


@case("backend", "inf and nan like torch")
def _(env):
    x = np.array([-1.0, 0.0, -0.0, 800.0, -800.0, 100.0, np.nan], np.float32)
    tx = torch.from_numpy(x).to(env.dev)       # float32 oracle here: overflow is float32's
    pairs = []
    for op, fn in (("log", torch.log), ("sqrt", torch.sqrt), ("inv", torch.reciprocal), ("exp", torch.exp),
                   ("sigmoid", torch.sigmoid), ("relu", torch.relu)):
        ours = _backend().map(op, TensorData.from_numpy(x, np.float32)).to_numpy()
        pairs.append((op, ours, fn(tx), 4 * EPS))
    num, den = np.array([1.0, 0.0, 2.0, -3.0], np.float32), np.array([0.0, 0.0, -0.0, 0.0], np.float32)
    ours = _backend().zip("div", TensorData.from_numpy(num, np.float32), TensorData.from_numpy(den, np.float32))
    pairs.append(("div by 0", ours.to_numpy(), torch.from_numpy(num).to(env.dev) / torch.from_numpy(den).to(env.dev), 0.0))
    return worst(pairs, "log, sqrt, inv, exp, sigmoid, relu of -1, 0, -0, 800, -800, 100, nan; x / 0")


@case("backend", "tensors stay on the device")
def _(env):
    """A forward and backward pass on the backend: host data goes up once, nothing comes back until read."""
    import course_lib.tensor as ct
    from course_lib.cuda import memory

    rng = env.rng("resident")
    n, k, m = env.size((67, 45, 33), (5, 4, 3))
    x, w, b = f32(rng, n, k), f32(rng, k, m), f32(rng, m)
    counts = {"up": 0, "down": 0}
    upload, download = memory.DeviceStorage.upload, memory.DeviceStorage.copy_to_host

    def counted_upload(host):
        counts["up"] += 1
        return upload(host)

    def counted_download(self):
        counts["down"] += 1
        return download(self)

    memory.DeviceStorage.upload, memory.DeviceStorage.copy_to_host = counted_upload, counted_download
    try:
        with ct.use_backend("cuda"):
            tx, tw, tb = (ct.Tensor(v, requires_grad=True) for v in (x, w, b))
            loss = ((tx @ tw + tb).relu() * 0.5).sum()
            loss.backward()
            resident = all(isinstance(t.data.storage, memory.DeviceStorage) for t in (loss, tx.grad, tw.grad, tb.grad))
            before_read = dict(counts)
            value = loss.item()
    finally:
        memory.DeviceStorage.upload, memory.DeviceStorage.copy_to_host = upload, download
    X, W, B = (env.t(v).requires_grad_() for v in (x, w, b))
    ref = ((X @ W + B).relu() * 0.5).sum()
    ref.backward()
    if not resident or before_read["down"]:
        return Check(math.inf, 0.0, f"results on the host ({not resident}) or copied back before a read: {before_read}")
    scale = float(((X.abs() @ W.abs() + B.abs()) * 0.5).sum().detach())
    return worst([("loss", np.array(value), ref.detach(), (k + n * m) * EPS * scale),
                  ("dW", tw.grad.numpy(), W.grad, n * EPS * float(X.abs().sum(0).max())),
                  ("db", tb.grad.numpy(), B.grad, n * EPS)],
                 f"(x @ w + b).relu() * 0.5, summed, and its backward: {before_read['up']} uploads, "
                 f"{before_read['down']} copies back before .item()")


@case("backend", "fused Adam against torch.optim.Adam")
def _(env):
    import course_lib.tensor as ct

    rng = env.rng("adam")
    size = env.size(100_003, 37)
    p0, grads = f32(rng, size), [f32(rng, size) for _ in range(3)]
    pairs = []
    for decoupled, wd in ((False, 0.0), (True, 0.1)):
        ours = ct.Tensor(p0, requires_grad=True)
        opt = (ct.optim.AdamW if decoupled else ct.optim.Adam)([ours], lr=1e-2, weight_decay=wd)
        theirs = env.t(p0).requires_grad_()
        topt = (torch.optim.AdamW if decoupled else torch.optim.Adam)([theirs], lr=1e-2, weight_decay=wd)
        with ct.use_backend("cuda"):
            for g in grads:
                ours.grad = ct.Tensor(g)
                opt.step()
                theirs.grad = env.t(g)
                topt.step()
        pairs.append(("AdamW" if decoupled else "Adam", ours.numpy(), theirs.detach(), 4 * EPS * amax(theirs.detach())))
    return worst(pairs, f"{size} parameters, 3 steps, lr 1e-2; AdamW with weight decay 0.1")


@case("backend", "digits MLP trains like the numpy backend")
def _(env):
    import course_lib.tensor as ct
    from course_lib.data import load_digits

    Xtr, _, ytr, _ = load_digits()
    hidden, batch, steps = env.size((128, 64, 5), (16, 8, 2))
    losses, params = {}, {}
    for name in ("numpy", "cuda"):
        ct.manual_seed(0)
        model = ct.nn.Sequential(ct.nn.Linear(64, hidden), ct.nn.ReLU(), ct.nn.Linear(hidden, 10))
        opt = ct.optim.Adam(model.parameters(), lr=3e-3)
        with ct.use_backend(name):
            for s in range(steps):
                loss = ct.cross_entropy(model(ct.Tensor(Xtr[s * batch:(s + 1) * batch])), ytr[s * batch:(s + 1) * batch])
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.setdefault(name, []).append(loss.item())
        params[name] = np.concatenate([p.numpy().ravel() for p in model.parameters()])
    return worst([("losses", np.array(losses["cuda"]), np.array(losses["numpy"]), 1e-5 * max(losses["numpy"])),
                  ("weights", params["cuda"], params["numpy"], 1e-5)],
                 f"64 -> {hidden} -> 10, Adam, {steps} steps of {batch} images, float32")


def capstone_losses(backends, layers, heads, width, block, batch, steps, seed=1):
    """{backend: the capstone GPT's training losses on it}: the same initial weights (chapter 04's PyTorch GPT),
    the same batches, AdamW and clipping as chapter 12 trains it, float32."""
    from course_lib.capstone import GPT, configure_optimizer, train_step
    from course_lib.gpt import TrainConfig, make_get_batch
    from course_lib.gpt.model import GPT as TorchGPT
    from course_lib.gpt.model import GPTConfig
    from course_lib.tensor import use_backend

    config = GPTConfig(vocab_size=11, block_size=block, n_layer=layers, n_head=heads, n_embd=width, dropout=0.0)
    cfg = TrainConfig(batch_size=batch, warmup_iters=1)
    tokens = np.random.default_rng(seed).integers(0, 11, 50 * block)
    losses = {}
    for name in backends:
        torch.manual_seed(seed)
        model = GPT.from_torch(TorchGPT(config))
        opt = configure_optimizer(model, cfg)
        get_batch = make_get_batch(tokens, block, batch, seed=seed)
        with use_backend(name):
            losses[name] = np.array([float(train_step(model, opt, *get_batch("train"), cfg.grad_clip))
                                     for _ in range(steps)])
    return losses


@case("backend", "capstone GPT trains like the numpy backend")
def _(env):
    if env.sim:
        raise Skip("about 15 s on the simulator: tests/test_ch07_backend.py runs it there, at a tiny size")
    layers, heads, width, block, batch, steps = 2, 4, 64, 32, 4, 3
    losses = capstone_losses(("numpy", "cuda"), layers, heads, width, block, batch, steps)
    return Check(gap(losses["cuda"], losses["numpy"]), 1e-5 * float(losses["numpy"].max()),
                 f"{layers} layer(s), {heads} heads, width {width}, block {block}, batch {batch}: AdamW, clipping, "
                 f"{steps} steps, float32; losses {', '.join(f'{v:.4f}' for v in losses['cuda'])}")


# ---- 3. chapter 08's custom ops: the Numba CUDA bias+ReLU and the .cu op of load_inline ----------------

def _bias_relu_inputs(env, name):
    rng = env.rng(name)
    shape = env.size((4, 37, 9, 11), (2, 3, 4, 5))
    x = torch.from_numpy(f32(rng, *shape)).to(env.dev)
    b = torch.from_numpy(f32(rng, shape[1])).to(env.dev)
    return x, b


@case("custom_ops", "numba bias_relu fwd+bwd")
def _(env):
    from course_lib.custom_ops import numba_cuda

    x, b = _bias_relu_inputs(env, "bias-relu")
    xr, br = x.requires_grad_(), b.requires_grad_()
    y = numba_cuda.bias_relu_cuda(xr, br)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(5)).to(env.dev)
    dx, db = torch.autograd.grad(y, (xr, br), dy)
    x64, b64 = x.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    ref = torch.relu(x64 + b64.view(1, -1, 1, 1))
    rdx, rdb = torch.autograd.grad(ref, (x64, b64), dy.double())
    inner = x[0, 0].numel() * x.shape[0]
    where_ = "numpy views (torch has no CUDA, or simulator)"
    if x.is_cuda:
        view = numba_cuda.kernel_view(x.detach())
        if view.device_ctypes_pointer.value != x.data_ptr():
            return Check(math.inf, 0.0, "the kernel's view of a CUDA tensor is a copy, not the tensor's memory")
        where_ = "CUDA tensors, zero-copy (the kernel's view shares the tensor's memory)"
    return worst([("y", y, ref, EPS * amax(ref)), ("dx", dx, rdx, 0.0),
                  ("db", db, rdb, inner * EPS * amax(dy))], f"shape {tuple(x.shape)}, {where_}")


@case("custom_ops", ".cu op (load_inline)")
def _(env):
    from torch.utils.cpp_extension import CUDA_HOME, is_ninja_available

    from course_lib.custom_ops import cpp

    if not env.torch_cuda:
        raise Skip(f"needs a CUDA build of torch that sees a GPU; this torch is {torch.__version__} "
                   f"(torch.version.cuda {torch.version.cuda})")
    if not cpp.cuda_available():
        raise Skip(f"needs nvcc: none on PATH and CUDA_HOME is {CUDA_HOME}")
    if not is_ninja_available():
        raise Skip("needs ninja to build a torch extension (pip install ninja)")
    start = time.perf_counter()
    module = cpp.build_cuda()
    built = time.perf_counter() - start
    x, b = _bias_relu_inputs(env, "cu-op")
    y = module.bias_relu_forward_cuda(x, b)
    ref = torch.relu(x.double() + b.double().view(1, -1, 1, 1))
    return Check(gap(y, ref), EPS * amax(ref), f"shape {tuple(x.shape)}; built or loaded in {built:.0f} s")


# ---- 4. selective scans: chapter 07's kernel, chapter 10's fused forward and backward ---------------------

def scan_inputs(env, b, L, D, N, seed, dtype=torch.float32, device=None):
    """Random inputs as Mamba makes them (Δ > 0, A < 0), drawn on the CPU, placed on `device`."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)   # noqa: E731
    delta = F.softplus(2 * r(b, L, D) - 1)
    args = (r(b, L, D), delta, -torch.exp(r(D, N)), r(b, L, N), r(b, L, N), r(D))
    return tuple(a.to(device or env.dev, dtype) for a in args)


def scan_reference(args64, dy, dh):
    """Chapter 05's loop in float64 with autograd: y, the last state, and the six gradients."""
    args = [a.clone().requires_grad_() for a in args64]
    y, h = selective_scan_sequential(*args, return_state=True)
    return y, h, torch.autograd.grad((y * dy).sum() + (h * dh).sum(), args)


NAMES = ("x", "delta", "A", "B", "C", "D")


@case("scan", "chapter 07 kernel (float64)")
def _(env):
    b, L, D, N = env.size((3, 301, 77, 13), (2, 13, 3, 3))
    args = scan_inputs(env, b, L, D, N, 7, torch.float64, device="cpu")
    y = S07.selective_scan(*(a.numpy() for a in args))
    ref = selective_scan_sequential(*(a.to(env.dev) for a in args))
    return Check(gap(y, ref), 1e-9 * max(1.0, amax(ref)), f"b={b}, L={L}, D={D}, N={N}: one block per (d, b)")


def _scan_case_sizes(env):
    return env.size((3, 301, 77, 13, 64), (2, 37, 5, 3, 8))      # b, L, D, N, chunk: b*D not a multiple of 64


@case("scan", "fused forward + backward")
def _(env):
    b, L, D, N, chunk = _scan_case_sizes(env)
    args = scan_inputs(env, b, L, D, N, 11)                      # float32 on env.dev (CPU tensors if no CUDA)
    g = torch.Generator().manual_seed(12)
    dy, dh = torch.randn(b, L, D, generator=g).to(env.dev), torch.randn(b, D, N, generator=g).to(env.dev)
    y, h, ckpt = scan_cuda.scan_forward(*args, chunk)
    grads = scan_cuda.scan_backward(*args, ckpt, dy, dh, chunk)
    ry, rh, rgrads = scan_reference([a.double() for a in args], dy.double(), dh.double())
    pairs = [("y", y, ry, 1e-4 * amax(ry)), ("h_last", h, rh, 1e-4 * amax(rh))]
    pairs += [(f"d{n}", m, r, 1e-4 * amax(r)) for n, m, r in zip(NAMES, grads, rgrads)]
    return worst(pairs, f"b={b}, L={L}, D={D}, N={N}, chunk {chunk}; kernels called directly")


@case("scan", "fused op + autograd on CUDA tensors")
def _(env):
    from course_lib.fused.scan_op import selective_scan_fused

    if not env.torch_cuda:
        raise Skip("needs CUDA tensors (torch has no CUDA here): the op sends CPU tensors to the CPU kernels")
    b, L, D, N, chunk = _scan_case_sizes(env)
    args = [a.requires_grad_() for a in scan_inputs(env, b, L, D, N, 13)]
    g = torch.Generator().manual_seed(14)
    dy, dh = torch.randn(b, L, D, generator=g).to(env.dev), torch.randn(b, D, N, generator=g).to(env.dev)
    y, h = selective_scan_fused(*args, return_state=True, chunk=chunk)
    grads = torch.autograd.grad((y * dy).sum() + (h * dh).sum(), args)
    ry, rh, rgrads = scan_reference([a.detach().double() for a in args], dy.double(), dh.double())
    pairs = [("y", y, ry, 1e-4 * amax(ry)), ("h_last", h, rh, 1e-4 * amax(rh))]
    pairs += [(f"d{n}", m, r, 1e-4 * amax(r)) for n, m, r in zip(NAMES, grads, rgrads)]
    return worst(pairs, "torch.library op course::selective_scan, its backward op, on the GPU")


# ---- 5. fused attention (chapter 10, course_lib/fused/attention_cuda.py) -----------------------------------

def attention_reference(q, k, v, do, causal):
    """out, lse and the three gradients in float64 with SDPA; causal means j <= i + Tk - Tq."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    Tq, Tk = q.shape[2], k.shape[2]
    mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq) if causal else None
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    lse = (scores.masked_fill(~mask, -math.inf) if causal else scores).logsumexp(-1)
    return (out.detach(), lse.detach(), *torch.autograd.grad(out, (q, k, v), do.double()))


def attention_inputs(env, B, H, Tq, Tk, d, dv, seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(env.dev)   # noqa: E731
    return r(B, H, Tq, d), r(B, H, Tk, d), r(B, H, Tk, dv), r(B, H, Tq, dv)


def _attention_case(Tq, Tk, causal):
    def fn(env):
        B, H, d, dv = env.size((2, 3, 40, 24), (1, 2, 8, 5))
        q, k, v, do = attention_inputs(env, B, H, Tq(env), Tk(env), d, dv, Tq(env) * 7 + Tk(env))
        out, lse = attention_cuda.forward(q, k, v, causal)
        dq, dk, dv_ = attention_cuda.backward(q, k, v, do, lse, (do * out).sum(-1), causal)
        r = attention_reference(q, k, v, do, causal)
        pairs = [(n, m, t, 1e-4 * max(1.0, amax(t))) for n, m, t in zip(("out", "lse", "dq", "dk", "dv"),
                                                                     (out, lse, dq, dk, dv_), r)]
        return worst(pairs, f"B={B}, H={H}, Tq={Tq(env)}, Tk={Tk(env)}, d={d}, dv={dv}, tile {attention_cuda.TILE}")
    return fn


case("attention", "fused fwd+bwd causal")(_attention_case(lambda e: e.size(333, 19), lambda e: e.size(333, 19), True))
case("attention", "fused fwd+bwd full")(_attention_case(lambda e: e.size(333, 19), lambda e: e.size(333, 19), False))
case("attention", "fused fwd+bwd causal Tq<Tk")(_attention_case(lambda e: e.size(101, 7), lambda e: e.size(333, 21), True))


@case("attention", "fused op + autograd on CUDA tensors")
def _(env):
    from course_lib.fused.attention_op import attention

    if not env.torch_cuda:
        raise Skip("needs CUDA tensors (torch has no CUDA here): the op sends CPU tensors to the CPU kernels")
    q, k, v, do = attention_inputs(env, 2, 3, 333, 333, 64, 64, 3)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = attention(q, k, v, causal=True)
    grads = torch.autograd.grad(out, (q, k, v), do)
    r = attention_reference(q, k, v, do, True)
    pairs = [(n, m, t, 1e-4 * max(1.0, amax(t))) for n, m, t in zip(("out", "dq", "dk", "dv"), (out, *grads),
                                                                     (r[0], *r[2:]))]
    return worst(pairs, "torch.library op course::attention and its backward, d = D_MAX = 64")


# ---- 6. launch limits: what the simulator forgives and a GPU refuses ---------------------------------------

@cuda.jit
def k_fill(out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = i


BIG_SHARED = 16 * 1024        # float32: 64 KiB, over the 48 KiB of static shared memory a block may have


@cuda.jit
def k_big_shared(out):
    buf = cuda.shared.array(BIG_SHARED, float32)
    t = cuda.threadIdx.x
    buf[t] = t
    cuda.syncthreads()
    out[t] = buf[t]


def _attempt(fn):
    """None if fn() ran, else the last line of what it raised."""
    try:
        fn()
        cuda.synchronize()
        return None
    except Exception as e:   # noqa: BLE001
        return _why(e)


def _why(e):
    """What a refusal said: its first line that mentions an error (a compiler log has many lines), else its last."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
    return next((ln for ln in lines if "error" in ln.lower()), lines[-1])[:200]


@case("limits", "1024-thread block runs")
def _(env):
    out = np.zeros(1024, np.float32)
    d = cuda.to_device(out)
    why = _attempt(lambda: k_fill[1, 1024](d))
    if why:
        return Check(math.inf, 0.0, f"a 1024-thread block was refused: {why}")
    return Check(gap(d.copy_to_host(), np.arange(1024)), 0.0, "the largest block a GPU allows")


@case("limits", "2048-thread block refused")
def _(env):
    d = cuda.to_device(np.zeros(2048, np.float32))
    why = _attempt(lambda: k_fill[1, 2048](d))
    if env.sim:
        return Check(status="INFO", note="accepted by the simulator, as expected (it runs any block size); "
                                         "a real GPU refuses it" if why is None else f"refused even here: {why}")
    if why is None:
        return Check(math.inf, 0.0, "a GPU ran a 2048-thread block: the course's limits say it must not")
    return Check(0.0, 0.0, f"refused by the GPU: {why}")


@case("limits", "64 KiB of static shared memory")
def _(env):
    """A fact, not a pass or a fail: how much static shared memory a block gets depends on the GPU and on
    the toolchain (ptxas's offline limit is 48 KiB; an H200 with driver 580 and Numba-CUDA 0.30.4 ran
    this kernel, and its results were right)."""
    out = np.zeros(32, np.float32)
    d = cuda.to_device(out)
    why = _attempt(lambda: k_big_shared[1, 32](d))
    if why is not None:
        return Check(status="INFO", note=f"refused: {why}")
    right = np.array_equal(d.copy_to_host(), np.arange(32, dtype=np.float32))
    where = "the simulator (it has no shared-memory limit)" if env.sim else "this GPU"
    return Check(status="INFO" if right else "", err=0.0 if right else math.inf, bound=0.0,
                 note=f"accepted by {where}" + ("" if right else ", with wrong results"))


@case("limits", "course launch() refuses both")
def _(env):
    refused = []
    for what, fn in (("2048 threads", lambda: launch(k_fill, 1, 2048, np.zeros(2048, np.float32))),
                     ("grid y 70000", lambda: launch(k_fill, (1, 70_000), 32, np.zeros(32, np.float32)))):
        try:
            fn()
        except LaunchError as e:
            refused.append(f"{what}: {str(e)[:60]}...")
    if len(refused) < 2:
        return Check(math.inf, 0.0, f"course_lib.cuda.launch accepted a configuration a GPU refuses ({refused})")
    return Check(0.0, 0.0, "LaunchError before any launch, on the simulator and on a GPU alike")


# ---- 7. NCCL through the course's launcher (chapter 11) ----------------------------------------------------

@case("nccl", "NCCL init, world size 1")
def _(env):
    import torch.distributed as dist

    avail = dist.is_nccl_available()
    if env.sim or not env.torch_cuda:
        raise Skip(f"needs a CUDA torch and a GPU; torch.distributed.is_nccl_available() = {avail}")
    if not avail:
        raise Skip(f"this torch build has no NCCL (torch {torch.__version__})")
    from course_lib.distributed import launch as dist_launch

    lengths = [7, 1001]
    start = time.perf_counter()
    [pairs] = dist_launch(ring_matches_all_reduce, 1, lengths, backend="nccl", timeout=60, wall_timeout=180)
    checks = []
    for n, (ring, allreduce) in zip(lengths, pairs):
        x = ring_input(n, 0)
        checks += [(f"ring n={n}", ring, x, 0.0), (f"all_reduce n={n}", allreduce, x, 0.0)]
    version = torch.cuda.nccl.version()
    nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return worst(checks, f"NCCL {nccl}; one spawned process through course_lib.distributed.launch, "
                         f"{time.perf_counter() - start:.0f} s")


def ring_input(n, rank, seed=0):
    """Rank `rank`'s random float64 vector of length n (the parent draws the same ones to sum them)."""
    return torch.randn(n, generator=torch.Generator().manual_seed(seed * 100_003 + n * 17 + rank), dtype=torch.float64)


def ring_matches_all_reduce(lengths, seed=0):
    """In each rank: [(chapter 11's ring all-reduce, dist.all_reduce)] of its ring_input(n), for each length n."""
    import torch.distributed as dist

    from course_lib.distributed.collectives import ring_all_reduce
    from course_lib.distributed.launch import device

    out = []
    for n in lengths:
        x = ring_input(n, dist.get_rank(), seed).to(device())
        a, b = x.clone(), x.clone()
        ring_all_reduce(a)
        dist.all_reduce(b)
        out.append((a.cpu(), b.cpu()))
    return out


# ---- figures --------------------------------------------------------------------------------------------

def interleaved(env, contestants, repeats):
    """Median seconds per call of each contestant: one untimed call each first (Numba compiles then), then
    `repeats` rounds in which every contestant runs once, in turns, the order rotating each round.
    On the simulator, where times mean nothing, each contestant runs once, timed, to keep the run short."""
    if env.sim:
        repeats = 1
    else:
        for fn in contestants.values():
            fn()
        env.sync()
    names, times = list(contestants), {k: [] for k in contestants}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            env.sync()
            t0 = time.perf_counter()
            contestants[name]()
            env.sync()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def ms(seconds):
    return f"{seconds * 1e3:.3f}" if seconds < 0.01 else f"{seconds * 1e3:.1f}"


TIMING_NOTE = ("Median of interleaved rounds after an untimed first call (compilation excluded); wall time "
               "with the device synchronized before and after each call. Another job on the GPU or a busy "
               "host CPU (these kernels are launched from Python) makes the course's side look slower.")


LADDER_STEPS = ("coalesced", "tiled", "1D blocking", "2D blocking")


@figure("matmul", "The matmul ladder against cuBLAS (float32, TF32 off)",
        ["n", *(f"{s} GFLOP/s (share)" for s in LADDER_STEPS), "cuBLAS GFLOP/s", "largest |C - cuBLAS's C|"])
def fig_matmul(env, fig):
    fig.notes += ["n x n float32 matrices already on the device; each step of course_lib/cuda/matmul.py and "
                  "torch.matmul (cuBLAS, TF32 off); share = the step's GFLOP/s over cuBLAS's. Median of 5 runs "
                  "after a warm-up, timed with CUDA events. The coalesced kernel is timed up to n = 2048. "
                  "Goal: 2D blocking at n = 4096 at least 50% of cuBLAS."]
    if env.sim or not env.torch_cuda:
        raise Skip("needs a GPU and a CUDA build of torch (cuBLAS); the simulator's times mean nothing")
    from ch07_matmul_gpu import ladder_rows, registers

    for n in (1024, 2048, 4096):
        if env.budget.spent():
            fig.skipped.append(f"n={n}")
            continue
        for n, times, errors in ladder_rows([n], 5):
            flops = 2.0 * n ** 3
            rate = {s: flops / t / 1e6 for s, t in times.items()}
            cells = [f"{rate[s]:.0f} ({rate[s] / rate['cuBLAS']:.1%})" if s in rate else "-" for s in LADDER_STEPS]
            yield [n, *cells, f"{rate['cuBLAS']:.0f}", f"{max(errors.values()):.1e}"]
    fig.notes.append("Registers and local memory per thread (the dispatcher's report): "
                     + "; ".join(f"{s}: {r} registers, {b} B local" for s, (r, b) in registers().items()) + ".")


@figure("mlp", "The CUDA backend's digits MLP epoch against PyTorch",
        ["model", "batches", "course (cuda backend) ms/epoch", "PyTorch ms/epoch", "course / PyTorch",
         "test acc course", "test acc PyTorch"])
def fig_mlp(env, fig):
    import course_lib.tensor as ct
    from course_lib.data import load_digits

    sizes, batch, n_batches = env.size(((64, 128, 64, 10), 64, None), ((64, 3, 10), 4, 1))
    Xtr, Xte, ytr, yte = load_digits()
    n_test = env.size(len(Xte), 16)                      # the simulator runs ~130 µs per thread
    Xte, yte = Xte[:n_test], yte[:n_test]
    order = np.random.default_rng(0).permutation(len(Xtr))
    chunks = [order[i:i + batch] for i in range(0, len(Xtr), batch)][:n_batches]
    rng = np.random.default_rng(0)
    weights = []
    for a, b in zip(sizes, sizes[1:]):
        bound = 1 / np.sqrt(a)
        weights.append((rng.uniform(-bound, bound, (b, a)).astype(np.float32),
                        rng.uniform(-bound, bound, b).astype(np.float32)))

    layers = []
    for W, b in weights:
        lin = ct.nn.Linear(W.shape[1], W.shape[0])
        lin.weight.copy_(ct.Tensor(W))
        lin.bias.copy_(ct.Tensor(b))
        layers += [lin, ct.nn.ReLU()]
    ours = ct.nn.Sequential(*layers[:-1])
    our_opt = ct.optim.Adam(ours.parameters(), lr=3e-3)
    tlayers = []
    for W, b in weights:
        lin = torch.nn.Linear(W.shape[1], W.shape[0])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(W))
            lin.bias.copy_(torch.from_numpy(b))
        tlayers += [lin, torch.nn.ReLU()]
    theirs = torch.nn.Sequential(*tlayers[:-1]).to(env.dev)
    their_opt = torch.optim.Adam(theirs.parameters(), lr=3e-3)
    tX, ty = torch.from_numpy(Xtr).to(env.dev), torch.from_numpy(ytr).to(env.dev)

    def course_epoch():
        with ct.use_backend("cuda"):
            for idx in chunks:
                loss = ct.cross_entropy(ours(ct.Tensor(Xtr[idx])), ytr[idx])
                our_opt.zero_grad()
                loss.backward()
                our_opt.step()

    def torch_epoch():
        for idx in chunks:
            i = torch.from_numpy(idx).to(env.dev)
            loss = F.cross_entropy(theirs(tX[i]), ty[i])
            their_opt.zero_grad()
            loss.backward()
            their_opt.step()

    repeats = env.size(3, 1)
    t = interleaved(env, {"course": course_epoch, "torch": torch_epoch}, repeats)
    with ct.no_grad(), ct.use_backend("cuda"):
        acc_ours = float((ours(ct.Tensor(Xte)).numpy().argmax(1) == yte).mean())
    with torch.no_grad():
        acc_theirs = float((theirs(torch.from_numpy(Xte).to(env.dev)).argmax(1).cpu().numpy() == yte).mean())
    fig.notes += [f"Adam lr 3e-3, float32, the same initial weights and batches; each contestant trains "
                  f"{repeats + (not env.sim)} epochs. {TIMING_NOTE}",
                  "The CUDA backend keeps tensors on the device (one upload per batch, no synchronize per op) "
                  "and launches one Numba kernel per op from Python, where PyTorch launches its own from C++; "
                  "at this size both measure launches more than arithmetic. Goal: at most 3x PyTorch's time.",
                  f"PyTorch runs on {env.dev}."]
    yield [" -> ".join(map(str, sizes)), len(chunks), ms(t["course"]), ms(t["torch"]),
           f"{t['course'] / t['torch']:.1f}x", f"{acc_ours:.3f}", f"{acc_theirs:.3f}"]


# The scan and attention figures (chapter 10 at GPU speed, with their goals) are in gpu_cases_ch10.py.


# ---- other files of cases: every gpu_cases_*.py beside this one, in name order --------------------------

def _more_cases():
    import importlib
    from pathlib import Path

    for path in sorted(Path(__file__).resolve().parent.glob("gpu_cases_*.py")):
        importlib.import_module(path.stem)


_more_cases()
