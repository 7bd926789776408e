"""Chapter 10 at GPU speed, in gpu_verify.py's one call: the attention and scan kernels, checked and timed.

The kernels are fused/attention_gpu.py and fused/scan_gpu.py (each a forward and a backward), which the
chapter's ops run on CUDA tensors.
This file adds to gpu_verify's groups `attention` and `scan`:

- cases: the kernels at the benchmark's head size (d = 64, N = 16) against PyTorch in float64, on
  lengths that are not multiples of a tile; and the dispatcher's report of each kernel (registers,
  local memory per thread, static shared memory per block), the profile behind a missed goal;
- figures, each row side by side on one device with its largest error and the goal:
  attention against scaled_dot_product_attention (float32, causal, d = 64, T = 2048 and 8192; goal:
  forward at most 3x SDPA's time, forward + backward at most 5x), and the scan against chapter 05's loop
  at (b, L, D, N) = (8, 2048, 1024, 16) (goal: at least 50x the loop forward, 25x forward + backward).

Under `gpu_verify.py --simulate` the sizes are tiny (the simulator runs each thread as Python) and the
times mean nothing; the run proves the file works. On a GPU the same call gives the figures:

    PYTHONPATH=. python3 benchmarks/gpu_verify.py --only attention,scan
"""

import torch
import torch.nn.functional as F
from gpu_cases import (
    TIMING_NOTE,
    amax,
    attention_inputs,
    attention_reference,
    gap,
    interleaved,
    ms,
    scan_inputs,
    scan_reference,
    worst,
)
from gpu_report import Check, Skip, case, figure
from numba import float32

from course_lib.fused import attention_cuda, attention_gpu, scan_cuda, scan_gpu
from course_lib.mamba.scan import selective_scan_sequential

ATTENTION_GOAL = (3.0, 5.0)      # at most this many times SDPA's time: forward, forward + backward
SCAN_GOAL = (50.0, 25.0)         # at least this many times faster than chapter 05's loop: forward, fwd+bwd


# ---- correctness at the benchmark's head sizes ------------------------------------------------------

@case("attention", "GPU forward causal Tq<Tk")
def _(env):
    B, H, Tq, Tk, d = env.size((2, 3, 200, 333, 64), (1, 1, 9, 40, 8))
    q, k, v, _ = attention_inputs(env, B, H, Tq, Tk, d, d, 64)
    out, lse = attention_gpu.forward(q, k, v, True)
    ref_out, ref_lse = attention_reference(q, k, v, torch.zeros_like(q), True)[:2]
    pairs = [(n, m, r, 1e-4 * max(1.0, amax(r))) for n, m, r in (("out", out, ref_out), ("lse", lse, ref_lse))]
    return worst(pairs, f"B={B}, H={H}, Tq={Tq}, Tk={Tk}, d={d}: attention_gpu.py, tiles of 64 x 64")


@case("attention", "GPU forward full")
def _(env):
    B, H, T, d = env.size((2, 3, 333, 64), (1, 1, 35, 8))
    q, k, v, _ = attention_inputs(env, B, H, T, T, d, d, 65)
    out, lse = attention_gpu.forward(q, k, v, False)
    ref_out, ref_lse = attention_reference(q, k, v, torch.zeros_like(q), False)[:2]
    pairs = [(n, m, r, 1e-4 * max(1.0, amax(r))) for n, m, r in (("out", out, ref_out), ("lse", lse, ref_lse))]
    return worst(pairs, f"B={B}, H={H}, T={T}, d={d}: attention_gpu.py, not causal")


@case("attention", "GPU backward causal Tq<Tk")
def _(env):
    B, H, Tq, Tk, d = env.size((2, 3, 200, 333, 64), (1, 1, 5, 12, 4))    # the simulator: a shuffle is a barrier
    q, k, v, do = attention_inputs(env, B, H, Tq, Tk, d, d, 66)
    out, lse = attention_gpu.forward(q, k, v, True)
    grads = attention_gpu.backward(q, k, v, do, lse, (do * out).sum(-1), True)
    ref = attention_reference(q, k, v, do, True)[2:]
    pairs = [(n, m, r, 1e-4 * max(1.0, amax(r))) for n, m, r in zip(("dq", "dk", "dv"), grads, ref)]
    return worst(pairs, f"B={B}, H={H}, Tq={Tq}, Tk={Tk}, d={d}: attention_gpu.py's dK/dV and dQ kernels")


@case("scan", "GPU backward")
def _(env):
    b, L, D, N, chunk = env.size((3, 301, 77, 16, 64), (1, 21, 35, 4, 8))
    args = scan_inputs(env, b, L, D, N, 32)
    g = torch.Generator().manual_seed(33)
    dy, dh = torch.randn(b, L, D, generator=g).to(env.dev), torch.randn(b, D, N, generator=g).to(env.dev)
    _, _, ckpt = scan_gpu.scan_forward(*args, chunk)
    grads = scan_gpu.scan_backward(*args, ckpt, dy, dh, chunk)
    _, _, ref = scan_reference([a.double() for a in args], dy.double(), dh.double())
    pairs = [(f"d{n}", m, r, 1e-4 * max(1.0, amax(r))) for n, m, r in zip(("x", "delta", "A", "B", "C", "D"), grads, ref)]
    return worst(pairs, f"b={b}, L={L}, D={D}, N={N}, chunk {chunk}: scan_gpu.py's backward")


@case("scan", "GPU forward")
def _(env):
    b, L, D, N, chunk = env.size((3, 301, 77, 16, 64), (1, 21, 35, 4, 8))
    args = scan_inputs(env, b, L, D, N, 31)
    y, h, ckpt = scan_gpu.scan_forward(*args, chunk)
    ref_y, ref_h = selective_scan_sequential(*(a.double() for a in args), return_state=True)
    _, _, ref_ckpt = scan_cuda.scan_forward_teaching(*args, chunk)       # the teaching kernel: float64 states
    pairs = [("y", y, ref_y, 1e-4 * amax(ref_y)), ("h_last", h, ref_h, 1e-4 * amax(ref_h)),
             ("checkpoints", ckpt, ref_ckpt, 1e-4 * max(1.0, amax(ref_ckpt)))]
    return worst(pairs, f"b={b}, L={L}, D={D}, N={N}, chunk {chunk}: scan_gpu.py, {scan_gpu.CHANNELS} channels a block")


# ---- the dispatcher's report: where each kernel's numbers live ----------------------------------------

def _kernels(env):
    """(name, dispatcher) of each chapter 10 kernel the figures run, each launched once so that it is compiled."""
    q, k, v, do = attention_inputs(env, 1, 1, 70, 70, 64, 64, 1)
    out, lse = attention_gpu.forward(q, k, v, True)
    attention_gpu.backward(q, k, v, do, lse, (do * out).sum(-1), True)
    args = scan_inputs(env, 1, 20, 40, 16, 2)
    y, h, ckpt = scan_gpu.scan_forward(*args, 8)
    scan_gpu.scan_backward(*args, ckpt, torch.ones_like(y), torch.zeros_like(h), 8)
    dkdv, dq = attention_gpu.backward_kernels(float32, 64, 64)
    return [("attention forward (attention_gpu, d=64)", attention_gpu.forward_kernel(float32, 64, 64)),
            ("attention dK/dV (attention_gpu)", dkdv), ("attention dQ (attention_gpu)", dq),
            ("scan forward (scan_gpu, N=16)", scan_gpu.forward_kernel(float32, 16)),
            ("scan backward (scan_gpu, N=16)", scan_gpu.backward_kernel(float32, 16))]


def profile_lines(env):
    """One line per kernel: registers per thread, local memory per thread, static shared memory per block."""
    lines = []
    for name, kernel in _kernels(env):
        for sig in kernel.overloads:
            lines.append(f"{name}: {kernel.get_regs_per_thread(sig)} registers, "
                         f"{kernel.get_local_mem_per_thread(sig)} B local, "
                         f"{kernel.get_shared_mem_per_block(sig)} B shared per block")
    return lines


@case("attention", "chapter 10 kernels: registers, local, shared")
def _(env):
    """A fact, printed: the GPU forwards must keep their blocks in registers (0 B of local memory)."""
    if env.sim:
        raise Skip("the dispatcher reports registers only for code compiled for a GPU")
    return Check(status="INFO", note="; ".join(profile_lines(env)))


# ---- figures ----------------------------------------------------------------------------------------

def _verdict(env, ratio, goal, at_most):
    if env.sim:
        return "not judged (simulator)"
    met = ratio <= goal if at_most else ratio >= goal
    return f"{'met' if met else 'MISSED'} ({'<=' if at_most else '>='} {goal:g}x)"


@figure("attention", "Chapter 10's attention at GPU speed against SDPA (float32, causal, d = 64)",
        ["B, H, T", "SDPA fwd ms", "course fwd ms", "course / SDPA fwd", "goal fwd", "SDPA fwd+bwd ms",
         "course fwd+bwd ms", "course / SDPA fwd+bwd", "goal fwd+bwd", "largest |out - SDPA|"])
def fig_attention_goal(env, fig):
    from course_lib.fused.attention_op import attention

    B, H, d = env.size((2, 8, 64), (1, 1, 8))
    fig.notes += [f"On {env.dev} tensors; the course's kernels are attention_gpu.py's (through the op "
                  f"course::attention when torch has CUDA). SDPA picks PyTorch's fastest float32 kernel. "
                  f"{TIMING_NOTE}"]

    def course(q, k, v):
        if env.torch_cuda:
            return attention(q, k, v, causal=True)
        return attention_gpu.forward(q, k, v, True)[0]

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    for T in env.size((2048, 8192), (70,)):
        if env.budget.spent():
            fig.skipped.append(f"T={T}")
            continue
        q, k, v, do = attention_inputs(env, B, H, T, T, d, d, T + 1)

        def with_grad(fn):
            def run():
                if fn is course and not env.torch_cuda:        # no autograd op without CUDA tensors
                    out, lse = attention_gpu.forward(q, k, v, True)
                    attention_cuda.backward(q, k, v, do, lse, (do * out).sum(-1), True)
                    return
                leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                (fn(*leaves) * do).sum().backward()
            return run

        with torch.no_grad():
            err = gap(course(q, k, v), sdpa(q.double(), k.double(), v.double()))
            t = interleaved(env, {"sdpa": lambda: sdpa(q, k, v), "course": lambda: course(q, k, v)}, env.size(5, 1))
        tg = interleaved(env, {"sdpa": with_grad(sdpa), "course": with_grad(course)}, env.size(3, 1))
        r, rg = t["course"] / t["sdpa"], tg["course"] / tg["sdpa"]
        yield [f"{B}, {H}, {T}", ms(t["sdpa"]), ms(t["course"]), f"{r:.2f}x", _verdict(env, r, ATTENTION_GOAL[0], True),
               ms(tg["sdpa"]), ms(tg["course"]), f"{rg:.2f}x", _verdict(env, rg, ATTENTION_GOAL[1], True), f"{err:.1e}"]
    if not env.sim:
        fig.notes.append("The dispatcher's report: " + "; ".join(profile_lines(env)) + ".")


@figure("scan", "Chapter 10's scan at GPU speed against chapter 05's loop (float32)",
        ["b, L, D, N", "loop fwd ms", "course fwd ms", "loop / course fwd", "goal fwd", "loop fwd+bwd ms",
         "course fwd+bwd ms", "loop / course fwd+bwd", "goal fwd+bwd", "largest |y - loop's y|"])
def fig_scan_goal(env, fig):
    from course_lib.fused.scan_op import selective_scan_fused

    fig.notes += [f"Chapter 05's selective_scan_sequential (one step of torch ops per position) and the course's "
                  f"kernels (scan_gpu.py; through the op course::selective_scan "
                  f"when torch has CUDA), both on {env.dev} tensors. {TIMING_NOTE}"]
    chunk = env.size(64, 4)
    for b, L, D, N in env.size(((8, 2048, 1024, 16),), ((1, 12, 33, 4),)):
        if env.budget.spent():
            fig.skipped.append(f"b={b}, L={L}, D={D}, N={N}")
            continue
        args = scan_inputs(env, b, L, D, N, 41)
        g = torch.Generator().manual_seed(42)
        dy = torch.randn(b, L, D, generator=g).to(env.dev)

        def course(*a):
            if env.torch_cuda:
                return selective_scan_fused(*a, chunk=chunk)
            return scan_gpu.scan_forward(*a, chunk)[0]

        def with_grad(scan):
            def run():
                if scan is course and not env.torch_cuda:      # no autograd op without CUDA tensors
                    y, h, ckpt = scan_gpu.scan_forward(*args, chunk)
                    scan_gpu.scan_backward(*args, ckpt, dy, torch.zeros_like(h), chunk)
                    return
                leaves = [a.clone().requires_grad_() for a in args]
                (scan(*leaves) * dy).sum().backward()
            return run

        with torch.no_grad():
            ref = selective_scan_sequential(*(a.double() for a in args))
            err = gap(course(*args), ref) / max(1.0, amax(ref))
            t = interleaved(env, {"loop": lambda: selective_scan_sequential(*args), "course": lambda: course(*args)},
                            env.size(3, 1))
        tg = interleaved(env, {"loop": with_grad(selective_scan_sequential), "course": with_grad(course)},
                         env.size(3, 1))
        r, rg = t["loop"] / t["course"], tg["loop"] / tg["course"]
        yield [f"{b}, {L}, {D}, {N}", ms(t["loop"]), ms(t["course"]), f"{r:.1f}x", _verdict(env, r, SCAN_GOAL[0], False),
               ms(tg["loop"]), ms(tg["course"]), f"{rg:.1f}x", _verdict(env, rg, SCAN_GOAL[1], False),
               f"{err:.1e} (relative to max |y|)"]
    if not env.sim:
        fig.notes.append("The dispatcher's report: " + "; ".join(profile_lines(env)) + ".")
