"""Chapter 06 benchmark: the course's Numba kernels against numpy, and the digits MLP on three stacks.

    python benchmarks/ch06_numba_cpu.py

Every measurement runs in its own Python process, so that Numba's and numpy's thread pools never
compete for the cores inside one process. Each process warms up (compiling, or loading the
Numba cache), then reports the best of several runs. Prints ratios: above 1 means faster than numpy.
"""

import subprocess
import sys
from pathlib import Path

from common import best_of

HERE = Path(__file__).resolve().parent
ROUNDS = 3


def worker(what, impl, n):
    """One measurement, in this process: prints seconds."""
    import numpy as np

    from course_lib.fast.backend import backend
    from course_lib.tensor.tensor_data import TensorData

    rng = np.random.default_rng(0)
    if what == "matmul":
        a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
        ta, tb = TensorData.from_numpy(a), TensorData.from_numpy(b)
        from course_lib.fast.matmul import matmul as tiled

        f = {"course": lambda: backend.matmul(ta, tb), "tiled": lambda: tiled(a, b), "numpy": lambda: a @ b}[impl]
    else:
        x = rng.standard_normal((n, n)).astype(np.float32)
        row = rng.standard_normal(n).astype(np.float32)
        tx, trow = TensorData.from_numpy(x), TensorData.from_numpy(row)
        course = {"map": lambda: backend.map("exp", tx),
                  "zip": lambda: backend.zip("add", tx, trow),
                  "reduce0": lambda: backend.reduce("sum", tx, 0),
                  "reduce1": lambda: backend.reduce("sum", tx, 1)}
        numpy = {"map": lambda: np.exp(x),
                 "zip": lambda: x + row,
                 "reduce0": lambda: x.sum(axis=0, keepdims=True),
                 "reduce1": lambda: x.sum(axis=1, keepdims=True)}
        f = course[what] if impl == "course" else numpy[what]
    print(best_of(f, repeat=7))


def measure(*args):
    out = subprocess.run([sys.executable, __file__, "worker", *map(str, args)], capture_output=True,
                         text=True, check=True, cwd=HERE.parent)
    return float(out.stdout.split()[-1])


def mlp(backend):
    """Best epoch of `backend` in a fresh process; for "both", the best of each backend, as (numpy, numba)."""
    out = subprocess.run([sys.executable, str(HERE / "ch06_mlp.py"), backend], capture_output=True, text=True,
                         check=True, cwd=HERE.parent)
    return tuple(map(float, out.stdout.split())) if backend == "both" else float(out.stdout.split()[0])


def main():
    print("ratio = numpy time / course time (above 1: the course kernel is faster)")
    for n in (256, 512, 1024):
        course, tiled, numpy = (measure("matmul", impl, n) for impl in ("course", "tiled", "numpy"))
        print(f"matmul {n:4d}x{n} float32: backend (BLAS) {course * 1e3:8.2f} ms  numpy {numpy * 1e3:8.2f} ms  "
              f"ratio {numpy / course:.2f}x;  section 7's tiled kernel {tiled * 1e3:8.2f} ms  ratio {numpy / tiled:.2f}x")
    for what, desc in [("map", "exp"), ("zip", "add, broadcast row"), ("reduce0", "sum over dim 0"),
                       ("reduce1", "sum over dim 1")]:
        course, numpy = measure(what, "course", 2048), measure(what, "numpy", 2048)
        print(f"{what:7s} 2048x2048 float32 ({desc}): course {course * 1e3:.2f} ms  numpy {numpy * 1e3:.2f} ms  "
              f"ratio {numpy / course:.2f}x")
    # The three run in turns, ROUNDS times, so that a slow spell of a shared machine hits all of them;
    # each keeps its best epoch.
    rounds = [{b: mlp(b) for b in ("numpy", "numba", "torch")} for _ in range(ROUNDS)]
    times = {b: min(r[b] for r in rounds) for b in rounds[0]}
    print(f"digits MLP 64-256-256-10, batch 64, Adam, one epoch (best of {2 * ROUNDS} epochs in {ROUNDS} "
          "interleaved processes each, after a warm-up epoch per process):")
    for b, t in times.items():
        print(f"  {b:6s} {t:.4f} s   (per round: {', '.join(f'{r[b]:.4f}' for r in rounds)})")
    print(f"  numba backend / PyTorch time: {times['numba'] / times['torch']:.2f} (goal: at most 1.5)")
    print(f"  numba backend's speed / numpy backend's: {times['numpy'] / times['numba']:.2f}x (goal: at least 1.5x)")
    both = [mlp("both") for _ in range(ROUNDS)]
    numpy, numba = min(t[0] for t in both), min(t[1] for t in both)
    print(f"both backends in one process, epochs in turns (as lesson 06 runs them): numpy {numpy:.4f} s, "
          f"numba {numba:.4f} s, numba's speed / numpy's {numpy / numba:.2f}x")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
