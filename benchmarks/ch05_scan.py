"""Chapter 05 benchmark: the selective scans side by side, and Mamba against the chapter 04 GPT at generation.

    python benchmarks/ch05_scan.py               # CPU (or the GPU when there is one)
    python benchmarks/ch05_scan.py --quick       # smaller sizes, for a smoke test

1. Forward time of the parallel (Hillis-Steele) and chunked scans against the sequential loop at
   L = 256, 1024, 4096, and the speed-up ratio of each over the loop. The "floor" column times
   discretize + readout alone: the work all three variants share, which writes and reads (b, L, D, N)
   tensors. No variant can beat it, so "floor x" (sequential / floor) is the best ratio any scan built
   on these pieces could reach on this machine. A second, clearly labelled table at D = 32 shows the
   regime where the loop's per-step overhead, not memory traffic, dominates.
2. Tokens per second of Mamba recurrent generation against GPT KV-cache generation after a prompt
   of 1k and 4k tokens, and the memory each keeps: the GPT's cache grows by 2 * n_layer * n_embd
   numbers per token, the Mamba state stays n_layer * d_inner * (d_conv - 1 + d_state) numbers.
"""

import argparse
import time

import torch

from course_lib.gpt.model import GPT, GPTConfig, KVCache
from course_lib.mamba import Mamba, MambaCache, MambaConfig
from course_lib.mamba.scan import discretize, readout, selective_scan_chunked, selective_scan_parallel, selective_scan_sequential


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timeit(fn, device, repeat=3):
    """The best of `repeat` wall times in seconds, after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def shared_work(x, delta, A, B, C, D):
    """What every scan does besides the recurrence itself: discretize, then read the states out."""
    a, b = discretize(x, delta, A, B)
    return readout(b, C, x, D)            # b stands in for the states: same shape, same cost


@torch.no_grad()
def bench_scans(device, lengths, b=1, D=256, N=16, label=""):
    print(f"selective scan forward, batch {b}, D {D}, N {N}, float32, on {device}{label}")
    print(f"{'L':>6} {'sequential ms':>14} {'parallel ms':>12} {'chunked ms':>11} {'floor ms':>9} "
          f"{'parallel x':>11} {'chunked x':>10} {'floor x':>8}")
    g = torch.Generator().manual_seed(0)
    for L in lengths:
        r = lambda *s: torch.randn(*s, generator=g).to(device)
        x, delta = r(b, L, D), torch.nn.functional.softplus(r(b, L, D) - 2)
        A, B, C, Dk = -torch.exp(r(D, N) * 0.5), r(b, L, N), r(b, L, N), r(D)
        args = (x, delta, A, B, C, Dk)
        ys = [selective_scan_sequential(*args), selective_scan_parallel(*args), selective_scan_chunked(*args)]
        err = max((y - ys[0]).abs().max().item() for y in ys[1:])
        repeat = 3 if L > 1024 else 7
        t_seq = timeit(lambda: selective_scan_sequential(*args), device, repeat)
        t_par = timeit(lambda: selective_scan_parallel(*args), device, repeat)
        t_chk = timeit(lambda: selective_scan_chunked(*args), device, repeat)
        t_flr = timeit(lambda: shared_work(*args), device, repeat)
        print(f"{L:>6} {1e3 * t_seq:>14.1f} {1e3 * t_par:>12.1f} {1e3 * t_chk:>11.1f} {1e3 * t_flr:>9.1f} "
              f"{t_seq / t_par:>10.1f}x {t_seq / t_chk:>9.1f}x {t_seq / t_flr:>7.1f}x   (max |diff| {err:.1e})")


@torch.no_grad()
def bench_generation(device, contexts, new_tokens=32, vocab=96, d_model=256, n_layer=4):
    mamba = Mamba(MambaConfig(vocab_size=vocab, d_model=d_model, n_layer=n_layer, d_state=16)).to(device).eval()
    gpt = GPT(GPTConfig(vocab_size=vocab, block_size=max(contexts) + new_tokens, n_layer=n_layer,
                        n_head=8, n_embd=d_model)).to(device).eval()
    print(f"\ngeneration, batch 1, {new_tokens} new tokens after the prompt, on {device}")
    print(f"  Mamba {mamba.num_params() / 1e6:.2f}M parameters (d_model {d_model}, {n_layer} layers); "
          f"GPT {gpt.num_params() / 1e6:.2f}M (n_embd {d_model}, {n_layer} layers)")
    print(f"{'context':>8} {'Mamba tok/s':>12} {'GPT tok/s':>10} {'Mamba/GPT':>10} "
          f"{'Mamba state KiB':>16} {'GPT cache KiB':>14} {'GPT KiB/token':>14}")
    for ctx in contexts:
        prompt = torch.randint(0, vocab, (1, ctx), generator=torch.Generator().manual_seed(ctx)).to(device)
        step = prompt[:, -1:]
        m_cache, g_cache = MambaCache(n_layer), KVCache(n_layer)
        mamba(prompt, cache=m_cache)
        gpt(prompt, cache=g_cache)
        m_state = m_cache.nbytes()
        kv = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in g_cache.layers)

        def run_mamba():
            cache = MambaCache(n_layer)
            cache.layers = [{k: v.clone() for k, v in layer.items()} for layer in m_cache.layers]
            cache.seen = ctx
            for _ in range(new_tokens):
                mamba(step, cache=cache)

        def run_gpt():
            cache = KVCache(n_layer)
            cache.layers = list(g_cache.layers)
            for _ in range(new_tokens):
                gpt(step, cache=cache)

        t_m, t_g = timeit(run_mamba, device, repeat=2), timeit(run_gpt, device, repeat=2)
        print(f"{ctx:>8} {new_tokens / t_m:>12.0f} {new_tokens / t_g:>10.0f} {t_g / t_m:>9.2f}x "
              f"{m_state / 1024:>16.1f} {kv / 1024:>14.1f} {kv / ctx / 1024:>14.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes, a smoke test")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    if args.device == "cpu":
        print(f"torch threads: {torch.get_num_threads()}")
    else:
        print(f"device: {torch.cuda.get_device_name()}")
    bench_scans(device, [64, 200] if args.quick else [256, 1024, 4096])
    print()
    bench_scans(device, [64, 200] if args.quick else [256, 1024], D=32,
                label="  [small D: the loop's per-step overhead dominates, not memory traffic]")
    bench_generation(device, [100, 300] if args.quick else [1024, 4096], new_tokens=8 if args.quick else 32)


if __name__ == "__main__":
    main()
