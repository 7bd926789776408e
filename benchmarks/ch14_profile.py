"""Chapter 14: where the time goes in the three figures of ch14_serving.py that can miss their goal.

    python benchmarks/ch14_profile.py [--part throughput|speculative|int8|all] [--threads 2] [--cache PATH]

- throughput: the engine serves the benchmark's trace once, each step timed and split into the scheduler,
  the paged attention kernel, the matrix products (numpy's BLAS), the rest of the forward (embedding, layer
  norms, GELU, residuals, cache writes) and the engine's own Python (the flat batch, sampling, bookkeeping);
  then the attention kernel on one decode batch against the same attention as batched BLAS products on
  contiguous keys and values, and Hugging Face's generate on the trace's first batch of 8 under torch's
  profiler;
- speculative: the benchmark's 8 prompts, speculative and alone, the time split between the target's calls,
  the draft's and the rest; then one call of each model at batch 1, by the number of tokens it runs;
- int8: each weight matrix of the target at batch 1, numpy's BLAS against the int8 kernel, the kernel run on
  one thread, an empty parallel launch, and one large matrix whose float32 bytes overflow the last-level
  cache.

The bench pair comes from the cache ch14_serving.py fills (run it once first). Timings are medians of
interleaved runs (course_lib.timing.compare) unless said otherwise.
"""

import argparse
import collections
from pathlib import Path

import common  # first: the thread pools read their thread count at import

THREADS = common.pin_threads(default=2)

import time  # noqa: E402

import ch14_serving as bench  # noqa: E402
import numba  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from numba import prange  # noqa: E402

from course_lib.serve.acceptance import accept  # noqa: E402
from course_lib.serve.engine import Engine  # noqa: E402
from course_lib.serve.int8 import int8_matmul, output_channel, quantize  # noqa: E402
from course_lib.serve.model import PagedGPT  # noqa: E402
from course_lib.serve.models import load_pair  # noqa: E402
from course_lib.serve.paged_attention import paged_attention  # noqa: E402
from course_lib.serve.scheduler import schedule  # noqa: E402
from course_lib.serve.speculative import Contiguous, plain_generate, speculative_generate  # noqa: E402
from course_lib.timing import compare  # noqa: E402

BLOCK = bench.BLOCK


@numba.njit(parallel=True, fastmath=True, cache=True)
def paged_attention_by_block(q, k_cache, v_cache, block_tables, context_lens, out, scale):
    """The first step of the course's kernel: still one task per (query, head), but a block's scores first,
    then one max, one rescale and its exponentials, instead of a comparison and a possible rescale at every
    position."""
    N, H, d = q.shape
    bs = k_cache.shape[1]
    for task in prange(N * H):
        i, h = task // H, task % H
        acc = np.zeros(d, np.float32)
        s = np.empty(bs, np.float32)
        m, total = np.float32(-1e30), np.float32(0.0)
        n = context_lens[i]
        for b in range((n + bs - 1) // bs):
            block, count = block_tables[i, b], min(bs, n - b * bs)
            top = np.float32(-1e30)
            for o in range(count):
                dot = np.float32(0.0)
                for c in range(d):
                    dot += q[i, h, c] * k_cache[block, o, h, c]
                s[o] = dot * scale
                top = max(top, s[o])
            if top > m:
                r = np.exp(m - top)
                total *= r
                for c in range(d):
                    acc[c] *= r
                m = top
            for o in range(count):
                w = np.exp(s[o] - m)
                total += w
                for c in range(d):
                    acc[c] += w * v_cache[block, o, h, c]
        for c in range(d):
            out[i, h, c] = acc[c] / total


@numba.njit(parallel=True, fastmath={"reassoc", "contract", "nsz", "arcp"}, cache=True)
def paged_attention_per_head(q, k_cache, v_cache, block_tables, context_lens, out, scale):
    """The course's kernel before it took all heads of a query in one task: one task per (query, head), each
    position folded into the online softmax on its own (a comparison, a possible rescale, an exponential)."""
    N, H, d = q.shape
    bs = k_cache.shape[1]
    for task in prange(N * H):
        i, h = task // H, task % H
        acc = np.zeros(d, q.dtype)
        m, total = -np.inf, q.dtype.type(0)
        for p in range(context_lens[i]):
            block, offset = block_tables[i, p // bs], p % bs
            s = q.dtype.type(0)
            for c in range(d):
                s += q[i, h, c] * k_cache[block, offset, h, c]
            s *= scale
            if s > m:
                r = np.exp(m - s)
                total *= r
                for c in range(d):
                    acc[c] *= r
                m = s
            w = np.exp(s - m)
            total += w
            for c in range(d):
                acc[c] += w * v_cache[block, offset, h, c]
        for c in range(d):
            out[i, h, c] = acc[c] / total


class Stopwatch:
    """Seconds and calls per named part; `wrap` times a function under a name."""

    def __init__(self):
        self.seconds, self.calls = collections.defaultdict(float), collections.defaultdict(int)

    def wrap(self, name, fn):
        def timed(*args):
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.seconds[name] += time.perf_counter() - start
                self.calls[name] += 1
        return timed


def timed_model(gpt, blocks, watch):
    """A PagedGPT whose attention, matrix products and forward report to `watch`."""
    timed_attention = watch.wrap("attention", paged_attention)

    def attention(q, k_cache, v_cache, tables, context_lens, out, scale):
        watch.calls["positions"] += int(context_lens.sum())          # (query, position) pairs, every layer
        return timed_attention(q, k_cache, v_cache, tables, context_lens, out, scale)

    model = PagedGPT.from_gpt(gpt, blocks, BLOCK, attention=attention)
    for layer in model.layers:
        for name in ("c_attn", "attn_proj", "c_fc", "mlp_proj"):
            layer[name] = watch.wrap("matmul", layer[name])
    model.head = watch.wrap("matmul", model.head)
    model.forward = watch.wrap("forward", model.forward)
    return model


def matmul_flops(gpt, tokens, rows):
    """The matrix products' flops for `tokens` tokens through the layers, `rows` of them through the head."""
    c = gpt.config
    return 2 * (c.n_layer * 12 * c.n_embd ** 2 * tokens + c.vocab_size * c.n_embd * rows)


# ---- throughput ---------------------------------------------------------------------------------------

def profile_throughput(pair, trace, blocks):
    print("## throughput: the engine on the trace, per step")
    watch = Stopwatch()
    model = timed_model(pair.target, blocks, watch)
    Engine(PagedGPT.from_gpt(pair.target, blocks, BLOCK)).run(trace[:4])        # kernels loaded
    engine = Engine(model, schedule=watch.wrap("schedule", schedule))
    steps = []
    step = engine.step

    def timed_step():
        before, positions = dict(watch.seconds), watch.calls["positions"]
        start = time.perf_counter()
        out = step()
        spent = time.perf_counter() - start
        parts = {k: watch.seconds[k] - before.get(k, 0.0) for k in watch.seconds}
        ran = engine.timeline[-1]
        steps.append({"seconds": spent, "seqs": len(ran), "tokens": sum(n for _, n, _ in ran),
                      "prefill": any(kind == "prefill" for _, _, kind in ran),
                      "positions": watch.calls["positions"] - positions,
                      **parts})
        return out

    engine.step = timed_step
    start = time.perf_counter()
    seqs = engine.run(trace)
    wall = time.perf_counter() - start
    total = sum(s["seconds"] for s in steps)
    tokens = sum(len(s.output) for s in seqs)
    fwd = watch.seconds["forward"]
    parts = {"attention (paged kernel)": watch.seconds["attention"],
             "matrix products (BLAS)": watch.seconds["matmul"],
             "rest of the forward (embedding, layer norms, GELU, residuals, cache writes)":
                 fwd - watch.seconds["attention"] - watch.seconds["matmul"],
             "scheduler": watch.seconds["schedule"],
             "engine's Python (flat batch, sampling, bookkeeping)": total - fwd - watch.seconds["schedule"]}
    print(f"{len(steps)} steps, {total:.2f} s in steps ({wall:.2f} s wall), {tokens} tokens generated, "
          f"{tokens / wall:.0f} tokens/s; {total / len(steps) * 1000:.1f} ms per step")
    print("| part | seconds | share | ms per step |")
    print("|---|---:|---:|---:|")
    for name, s in parts.items():
        print(f"| {name} | {s:.2f} | {s / total:.0%} | {s / len(steps) * 1000:.1f} |")
    computed = sum(s["tokens"] for s in steps)
    flops = matmul_flops(pair.target, computed, sum(s["seqs"] for s in steps))
    print(f"matrix products: {computed} tokens computed (prefill and decode), "
          f"{flops / watch.seconds['matmul'] / 1e9:.1f} GFLOP/s")
    H, d = pair.target.config.n_head, pair.target.config.n_embd // pair.target.config.n_head
    decode = [s for s in steps if not s["prefill"] and s["seqs"]]
    if decode:
        att = sum(s["attention"] for s in decode)
        pos = sum(s["positions"] for s in decode)
        print(f"decode-only steps: {len(decode)}, {statistics_line([s['seqs'] for s in decode])} sequences per step, "
              f"{sum(s['seconds'] for s in decode) / len(decode) * 1000:.1f} ms per step, of which attention "
              f"{att / len(decode) * 1000:.1f} ms; attention {att / (pos * H) * 1e9:.1f} ns per (query, head, "
              f"position) = {4 * d * pos * H / att / 1e9:.2f} GFLOP/s")
    print(f"sequences per step over the trace: {statistics_line([s['seqs'] for s in steps])}; tokens per step: "
          f"{statistics_line([s['tokens'] for s in steps])}")
    buckets = collections.defaultdict(list)
    for s in steps:
        if s["seqs"]:
            buckets[min(s["seqs"] // 8, 8)].append(s)
    print("| sequences in the step | steps | ms per step | attention ms | matmul ms | rest ms | ms per sequence |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for b in sorted(buckets):
        group = buckets[b]
        n = len(group)
        ms = lambda key: sum(s.get(key, 0.0) for s in group) / n * 1000   # noqa: E731
        seqs_mean = sum(s["seqs"] for s in group) / n
        label = f"{8 * b}-{8 * b + 7}" if b < 8 else "64"
        print(f"| {label} | {n} | {ms('seconds'):.1f} | {ms('attention'):.1f} | {ms('matmul'):.1f} | "
              f"{ms('seconds') - ms('attention') - ms('matmul'):.1f} | {ms('seconds') / seqs_mean:.2f} |")

    print()
    print("## attention alone: one decode batch of 64 sequences at 300 positions (8 heads of 32)")
    rng = np.random.default_rng(0)
    n_seq, ctx = 64, 300
    per = -(-ctx // BLOCK)
    kc = rng.standard_normal((n_seq * per, BLOCK, H, d), dtype=np.float32)
    vc = rng.standard_normal((n_seq * per, BLOCK, H, d), dtype=np.float32)
    tables = rng.permutation(n_seq * per).astype(np.int32).reshape(n_seq, per)
    q = rng.standard_normal((n_seq, H, d), dtype=np.float32)
    lens = np.full(n_seq, ctx, np.int64)
    out = np.empty_like(q)
    k_contig = kc[tables].reshape(n_seq, per * BLOCK, H, d)[:, :ctx].transpose(0, 2, 1, 3).copy()   # (S, H, T, d)
    v_contig = vc[tables].reshape(n_seq, per * BLOCK, H, d)[:, :ctx].transpose(0, 2, 1, 3).copy()
    scale = np.float32(1 / np.sqrt(d))

    def blas_attention():
        s = np.matmul(k_contig, q[:, :, :, None])[..., 0] * scale          # (S, H, T)
        w = np.exp(s - s.max(-1, keepdims=True))
        return np.matmul((w / w.sum(-1, keepdims=True))[:, :, None, :], v_contig)[:, :, 0]

    paged_attention(q, kc, vc, tables, lens, out, scale)
    assert np.allclose(out, blas_attention(), atol=1e-4)
    out2 = np.empty_like(q)
    paged_attention_by_block(q, kc, vc, tables, lens, out2, scale)
    assert np.allclose(out2, out, atol=1e-4)
    out3 = np.empty_like(q)
    paged_attention_per_head(q, kc, vc, tables, lens, out3, scale)
    assert np.allclose(out3, out, atol=1e-4)
    ms = compare({"paged kernel (the course's: a task per query, all its heads)": lambda: paged_attention(
                      q, kc, vc, tables, lens, out, scale),
                  "paged, a task per (query, head), position by position (the course's before)": lambda:
                      paged_attention_per_head(q, kc, vc, tables, lens, out3, scale),
                  "paged, a task per (query, head), a block's scores at once": lambda: paged_attention_by_block(
                      q, kc, vc, tables, lens, out2, scale),
                  "numpy batched matmul on contiguous K, V": blas_attention}, rounds=7)
    for name, t in ms.items():
        print(f"  {name}: {t:.2f} ms per layer, {t * 1e6 / (n_seq * H * ctx):.1f} ns per (query, head, position), "
              f"{4 * d * n_seq * H * ctx / t / 1e6:.2f} GFLOP/s")

    print()
    print("## Hugging Face generate, the trace's first batch of 8, under torch's profiler")
    hf = bench.hf_model(pair.target)
    bench.serve_hf(hf, trace[:8])
    start = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        bench.serve_hf(hf, trace[:8])
    steps_hf = max(n for _, _, n in trace[:8])
    print(f"{steps_hf} steps at batch 8 (under the profiler: {(time.perf_counter() - start) / steps_hf * 1000:.1f} ms "
          "per step); self CPU time by op:")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=40))
    start = time.perf_counter()
    bench.serve_hf(hf, trace[:8])
    print(f"the same batch without the profiler: {(time.perf_counter() - start) / steps_hf * 1000:.1f} ms per step")


def statistics_line(values):
    v = np.array(values)
    return f"median {np.median(v):.0f}, mean {v.mean():.1f}, max {v.max()}"


# ---- speculative decoding -------------------------------------------------------------------------------

def profile_speculative(pair, trace, k):
    print("## speculative decoding: the benchmark's 8 prompts (128 tokens, 128 generated)")
    watch = Stopwatch()
    blocks = 512 // BLOCK + 1
    target, draft = PagedGPT.from_gpt(pair.target, blocks, BLOCK), PagedGPT.from_gpt(pair.draft, blocks, BLOCK)
    sizes = collections.defaultdict(lambda: [0, 0.0])   # (run, model, tokens per call) -> [calls, seconds]
    run_name = ["speculative"]

    def by_size(name, forward):
        def timed(tokens, *rest):
            start = time.perf_counter()
            out = forward(tokens, *rest)
            entry = sizes[(run_name[0], name, "prefill" if len(tokens) > k + 1 else len(tokens))]
            entry[0] += 1
            entry[1] += time.perf_counter() - start
            return out
        return timed

    target.forward = by_size("target", watch.wrap("target", target.forward))
    draft.forward = by_size("draft", watch.wrap("draft", draft.forward))
    prompts = [q[-128:] for _, q, _ in trace[:8]]
    speculative_generate(target, draft, prompts[0], 8, k, accept)            # kernels loaded
    watch.seconds.clear()
    watch.calls.clear()
    sizes.clear()
    spec = {"target": 0.0, "draft": 0.0, "wall": 0.0}
    alone = {"target": 0.0, "wall": 0.0}
    calls = collections.Counter()
    for q in prompts:
        before = dict(watch.seconds)
        start = time.perf_counter()
        _, stats = speculative_generate(target, draft, q, 128, k, accept)
        spec["wall"] += time.perf_counter() - start
        for m in ("target", "draft"):
            spec[m] += watch.seconds[m] - before.get(m, 0.0)
        calls.update(stats)
        before = watch.seconds["target"]
        run_name[0] = "alone"
        start = time.perf_counter()
        plain_generate(target, q, 128)
        alone["wall"] += time.perf_counter() - start
        alone["target"] += watch.seconds["target"] - before
        run_name[0] = "speculative"
    n = 128 * len(prompts)
    print(f"speculative: {spec['wall']:.2f} s = target {spec['target']:.2f} s ({calls['target_calls']} calls, "
          f"{spec['target'] / calls['target_calls'] * 1000:.2f} ms each) + draft {spec['draft']:.2f} s "
          f"({calls['draft_calls']} calls, {spec['draft'] / calls['draft_calls'] * 1000:.2f} ms each) + the rest "
          f"{spec['wall'] - spec['target'] - spec['draft']:.2f} s (acceptance, probabilities, Python)")
    print(f"  {calls['target_calls'] / n:.3f} target calls and {calls['draft_calls'] / n:.2f} draft calls per token; "
          f"{calls['accepted'] / calls['drafted']:.0%} of drafts kept")
    print(f"alone: {alone['wall']:.2f} s = target {alone['target']:.2f} s ({n} calls, "
          f"{alone['target'] / n * 1000:.2f} ms each) + the rest {alone['wall'] - alone['target']:.2f} s")
    print(f"speed-up {alone['wall'] / spec['wall']:.2f}x; with a draft that cost nothing it would be "
          f"{alone['wall'] / (spec['wall'] - spec['draft']):.2f}x")
    print("| run | model | tokens per call | calls | ms per call | seconds |")
    print("|---|---|---|---:|---:|---:|")
    for (run, name, size), (n_calls, seconds) in sorted(sizes.items(), key=lambda kv: str(kv[0])):
        print(f"| {run} | {name} | {size} | {n_calls} | {seconds / n_calls * 1000:.2f} | {seconds:.2f} |")
    prefill = sum(v[1] for (run, _, size), v in sizes.items() if run == "alone" and size == "prefill")
    prefill_spec = sum(v[1] for (run, _, size), v in sizes.items() if run == "speculative" and size == "prefill")
    print(f"without the prompts' prefills: {(alone['wall'] - prefill) / (spec['wall'] - prefill_spec):.2f}x")

    print()
    print("## one call at batch 1, at position 200 of a 128-token prompt's sequence (ms)")
    run_t, run_d = Contiguous(PagedGPT.from_gpt(pair.target, blocks, BLOCK)), Contiguous(
        PagedGPT.from_gpt(pair.draft, blocks, BLOCK))
    ids = np.array(prompts[0] + prompts[1])[:205]
    run_t(ids[:200], 0)
    run_d(ids[:200], 0)
    contestants = {}
    for name, run in (("target", run_t), ("draft", run_d)):
        for m in (1, 2, 5):
            contestants[f"{name}, {m} token{'s' if m > 1 else ''}"] = (lambda run=run, m=m: run(ids[200:200 + m], 200))
    ms = compare(contestants, rounds=7)
    for name, t in ms.items():
        print(f"  {name}: {t:.3f}")
    print(f"  draft / target, one token: {ms['draft, 1 token'] / ms['target, 1 token']:.2f}; parameters "
          f"{pair.draft.num_params() / pair.target.num_params():.2f}")
    watch = Stopwatch()
    for name, gpt in (("target", pair.target), ("draft", pair.draft)):
        model = timed_model(gpt, blocks, watch)
        run = Contiguous(model)
        run(ids[:200], 0)
        watch.seconds.clear()
        reps = 200
        for _ in range(reps):
            run(ids[200:201], 200)
        s = {key: v / reps * 1000 for key, v in watch.seconds.items()}
        print(f"  {name}, one token, split: forward {s['forward']:.3f} ms = attention {s['attention']:.3f} "
              f"({gpt.config.n_layer} calls) + matrix products {s['matmul']:.3f} ({4 * gpt.config.n_layer + 1} calls) "
              f"+ the rest {s['forward'] - s['attention'] - s['matmul']:.3f}")


# ---- int8 ---------------------------------------------------------------------------------------------------

@numba.njit(fastmath=True, cache=True)
def int8_matmul_one_thread(x, q, scale, out):
    """int8_matmul's loops on one thread, whatever the size: no parallel launch."""
    for j in range(q.shape[0]):
        output_channel(x, q, scale, out, j)


@numba.njit(parallel=True, cache=True)
def empty_launch(out):
    for j in prange(out.shape[0]):
        out[j] = 0.0


def profile_int8(pair):
    print("## int8 at batch 1: each weight matrix of the target, one call (ms)")
    rng = np.random.default_rng(0)
    c = pair.target.config
    shapes = {"c_attn": (3 * c.n_embd, c.n_embd), "attn_proj": (c.n_embd, c.n_embd),
              "c_fc": (4 * c.n_embd, c.n_embd), "mlp_proj": (c.n_embd, 4 * c.n_embd),
              "head": (c.vocab_size, c.n_embd)}
    dummy = np.empty(THREADS * 4, np.float32)
    empty_launch(dummy)
    print(f"Numba threading layer: {numba.threading_layer()}, {numba.get_num_threads()} threads")
    per_token = collections.Counter()
    print("| matrix (out, in) | float32 BLAS | int8 kernel | int8, one thread | int8 / float32 |")
    print("|---|---:|---:|---:|---:|")
    sd = {k: v.numpy() for k, v in pair.target.state_dict().items()}
    real = {"c_attn": sd["transformer.h.0.attn.c_attn.weight"], "attn_proj": sd["transformer.h.0.attn.c_proj.weight"],
            "c_fc": sd["transformer.h.0.mlp.c_fc.weight"], "mlp_proj": sd["transformer.h.0.mlp.c_proj.weight"],
            "head": sd["transformer.wte.weight"]}
    for name, shape in shapes.items():
        w = np.ascontiguousarray(real[name], np.float32)
        assert w.shape == shape
        qw, s = quantize(w)
        x = rng.standard_normal((1, shape[1]), dtype=np.float32)
        out = np.empty((1, shape[0]), np.float32)
        int8_matmul_one_thread(x, qw, s, out)
        ms = compare({"float": lambda: x @ w.T, "int8": lambda: int8_matmul(x, qw, s, out),
                      "one": lambda: int8_matmul_one_thread(x, qw, s, out)}, rounds=9)
        times = 1 if name == "head" else c.n_layer
        for key in ms:
            per_token[key] += times * ms[key]
        print(f"| {name} {shape} | {ms['float'] * 1000:.1f} µs | {ms['int8'] * 1000:.1f} µs | {ms['one'] * 1000:.1f} µs | "
              f"{ms['int8'] / ms['float']:.2f} |")
    print(f"sum of the above per token (6 layers and the head, each matrix warm in cache): float32 "
          f"{per_token['float']:.3f} ms, int8 {per_token['int8']:.3f} ms, "
          f"int8 on one thread {per_token['one']:.3f} ms")
    mats = [np.ascontiguousarray(sd[f"transformer.h.{i}.{name}.weight"], np.float32) for i in range(c.n_layer)
            for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")] + [real["head"]]
    quantized = [quantize(w) for w in mats]
    xs = {n: rng.standard_normal((1, n), dtype=np.float32) for n in {w.shape[1] for w in mats}}
    outs = [np.empty((1, w.shape[0]), np.float32) for w in mats]

    def sweep_float():
        for w in mats:
            xs[w.shape[1]] @ w.T

    def sweep(kernel):
        for (qw, s), out in zip(quantized, outs):
            kernel(xs[qw.shape[1]], qw, s, out)

    ms = compare({"float": sweep_float, "int8": lambda: sweep(int8_matmul),
                  "one": lambda: sweep(int8_matmul_one_thread)}, rounds=9)
    print(f"all {len(mats)} matrices in turn, as one token reads them (ms): float32 {ms['float']:.3f}, int8 "
          f"{ms['int8']:.3f}, int8 on one thread {ms['one']:.3f}")
    launch = compare({"empty": lambda: empty_launch(dummy)}, rounds=9)["empty"]
    print(f"an empty parallel launch: {launch * 1000:.1f} µs; {c.n_layer * 4 + 1} int8 launches per token: "
          f"{(c.n_layer * 4 + 1) * launch:.3f} ms")
    f32_bytes = sum(np.prod(s) * (1 if n == "head" else c.n_layer) for n, s in shapes.items()) * 4
    print(f"float32 weight matrices: {f32_bytes / 2**20:.1f} MiB (last-level cache: see lscpu)")

    print()
    print("## one large matrix, 4096 x 4096 (float32 64 MiB, int8 16 MiB), batch 1")
    w = rng.standard_normal((4096, 4096), dtype=np.float32)
    qw, s = quantize(w)
    x = rng.standard_normal((1, 4096), dtype=np.float32)
    out = np.empty((1, 4096), np.float32)
    ms = compare({"float": lambda: x @ w.T, "int8": lambda: int8_matmul(x, qw, s, out)}, rounds=7)
    print(f"  float32 BLAS {ms['float']:.3f} ms ({w.nbytes / ms['float'] / 1e6:.1f} GB/s), int8 kernel "
          f"{ms['int8']:.3f} ms ({qw.nbytes / ms['int8'] / 1e6:.1f} GB/s): int8 / float32 {ms['int8'] / ms['float']:.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["throughput", "speculative", "int8", "all"], default="all")
    p.add_argument("--threads", type=int, default=THREADS)
    p.add_argument("--gap", type=float, default=0.01)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--blocks", type=int, default=2048)
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "course" / "ch14_bench_pair.npz"))
    args = p.parse_args()
    torch.set_num_threads(THREADS)
    pair = load_pair(Path(args.cache))
    trace = bench.make_trace(pair, gap=args.gap)
    print(f"{THREADS} threads; target {pair.target.num_params():,} parameters, draft {pair.draft.num_params():,}")
    if args.part in ("int8", "all"):
        profile_int8(pair)
        print()
    if args.part in ("speculative", "all"):
        profile_speculative(pair, trace, args.k)
        print()
    if args.part in ("throughput", "all"):
        profile_throughput(pair, trace, args.blocks)


if __name__ == "__main__":
    main()
