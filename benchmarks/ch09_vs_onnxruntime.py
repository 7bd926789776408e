"""Latency of the course's numpy engine against onnxruntime, side by side in one run.

Models: the MLP, chapter 08's CNN (both trained 4 epochs on the digits) and chapter 04's GPT,
from course_lib.infer.models, exported with
torch.onnx.export(dynamo=False); batch 1 and 32; the engine without and with its passes.
A ratio is engine time / onnxruntime time (lower is better; 1.0 means as fast): the median, over
interleaved rounds, of the ratio within each round (for the engine with passes, the lowest and highest
round too: a wide spread says the machine was busy). In a round each contestant runs back to back
for about a millisecond (at least once), and its time is the mean of those calls.

    .venv/bin/python benchmarks/ch09_vs_onnxruntime.py [--repeats 20] [--threads 1] [--clock cpu]

Both sides get the same number of threads (default 1: numpy's BLAS through OPENBLAS_NUM_THREADS,
set before numpy loads; onnxruntime through intra_op_num_threads). On a shared 2-core machine,
multi-threaded BLAS under contention is many times slower and the figures become noise.
With one thread, `--clock cpu` times each contestant by the CPU time of the thread that runs both
(time.thread_time: onnxruntime runs a one-thread session in the caller's thread), which waiting for
a core does not inflate; on a busy machine the figures still rise, as other work shares the caches.
"""

import argparse
import os
import platform
import sys
import time

_threads = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv else "1"
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = _threads

import numpy as np  # noqa: E402  (after the thread variables are set)
import onnxruntime as ort  # noqa: E402  (after the thread variables are set)
import torch  # noqa: E402  (after the thread variables are set)

from course_lib.infer import InferenceSession  # noqa: E402  (after the thread variables are set)
from course_lib.infer.models import MLP, course_cnn, course_gpt, export, train_digits  # noqa: E402  (after the thread variables are set)


def side_by_side(fns, repeats, clock=time.perf_counter):
    """Time the functions in turn, for `repeats` rounds (after a warm-up round that also counts how many
    calls of each take about a millisecond; a round runs that many back to back).

    Interleaving spreads any load from other processes evenly over the contestants. Returns the median
    milliseconds per call of each and, for each function after the first, its time divided by the first's
    time in the same round: (median, min, max) over the rounds."""
    calls = []
    for fn in fns:
        t0 = clock()
        fn()
        calls.append(max(1, int(1e-3 / max(clock() - t0, 1e-6))))
    times = np.zeros((repeats, len(fns)))
    for r in range(repeats):
        for k, (fn, n) in enumerate(zip(fns, calls)):
            t0 = clock()
            for _ in range(n):
                fn()
            times[r, k] = (clock() - t0) / n
    per_round = [times[:, k] / times[:, 0] for k in range(1, len(fns))]
    ratios = [(float(np.median(r)), float(r.min()), float(r.max())) for r in per_round]
    return 1e3 * np.median(times, axis=0), ratios


def blas_threads():
    """What numpy's BLAS really uses (threadpoolctl), or what we asked for when it is not installed."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return f"OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}"
    return ", ".join(f"{os.path.basename(p['filepath'])} {p['num_threads']}"
                     for p in threadpool_info() if p["user_api"] == "blas")


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def models():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    gpt = course_gpt()
    mlp, cnn = MLP(), course_cnn()
    train_digits(mlp), train_digits(cnn)
    T = 64
    yield ("MLP", export(mlp, torch.randn(2, 64), ["x"], ["y"], {"x": {0: "batch"}}),
           lambda b: {"x": rng.standard_normal((b, 64)).astype(np.float32)})
    yield ("CNN", export(cnn, torch.randn(2, 1, 8, 8), ["x"], ["y"], {"x": {0: "batch"}}),
           lambda b: {"x": rng.standard_normal((b, 1, 8, 8)).astype(np.float32)})
    yield ("GPT (chapter 04)", export(gpt, torch.zeros(2, T, dtype=torch.long), ["idx"], ["logits"],
                                     {"idx": {0: "batch", 1: "time"}}),
           lambda b: {"idx": rng.integers(0, 65, (b, T)).astype(np.int64)})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: the CPU time of the one thread (only with --threads 1; for a busy machine)")
    parser.add_argument("--models", default="MLP,CNN,GPT", help="a comma-separated subset of MLP, CNN, GPT")
    args = parser.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu measures one thread: use it with --threads 1")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = args.threads
    print(f"{cpu_name()}; torch {torch.__version__}, onnxruntime {ort.__version__}, numpy {np.__version__}; "
          f"{args.repeats} interleaved rounds, medians, {args.clock} clock")
    print(f"threads: numpy BLAS {blas_threads()} (numpy's other kernels run on one); onnxruntime "
          f"intra_op {options.intra_op_num_threads}, inter_op {options.inter_op_num_threads}; torch (export only) "
          f"{torch.get_num_threads()}")
    print(f"{'model':<20}{'batch':>6}{'ort ms':>10}{'engine ms':>11}{'ratio':>8}{'+passes ms':>12}{'ratio':>8}"
          f"{'(min-max)':>13}{'max|diff|':>11}")
    wanted = args.models.split(",")
    for name, onx, feeds_for in models():
        if name.split(" ")[0] not in wanted:
            continue
        for batch in (1, 32):
            feeds = feeds_for(batch)
            shapes = {k: v.shape for k, v in feeds.items()}
            ref = ort.InferenceSession(onx, options, providers=["CPUExecutionProvider"])
            plain = InferenceSession(onx)
            fast = InferenceSession(onx, optimize=True, input_shapes=shapes)
            diff = max(float(np.max(np.abs(a - b))) for a, b in zip(ref.run(None, feeds), fast.run(None, feeds)))
            (t_ort, t_plain, t_fast), (r_plain, r_fast) = side_by_side(
                [lambda: ref.run(None, feeds), lambda: plain.run(None, feeds), lambda: fast.run(None, feeds)],
                args.repeats, clock)
            spread = f"{r_fast[1]:.2f}-{r_fast[2]:.2f}"
            print(f"{name:<20}{batch:>6}{t_ort:>10.3f}{t_plain:>11.3f}{r_plain[0]:>8.2f}"
                  f"{t_fast:>12.3f}{r_fast[0]:>8.2f}{spread:>13}{diff:>11.2e}")


if __name__ == "__main__":
    main()
