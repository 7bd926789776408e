"""Chapter 01 benchmark: micrograd's moons demo on the course engine and on micrograd itself.

Both engines train the same 2-16-16-1 MLP (same initial weights) on 100 moons points with
noise 0.1, for 100 full-batch steps of SGD on the SVM max-margin loss plus L2, as in
micrograd's demo notebook. The script prints both loss curves' largest difference and the
speed ratio. It takes a few minutes, most of them spent in micrograd.

    .venv/bin/python benchmarks/ch01_micrograd.py [--steps 100]
"""

import argparse
import gc
import random
import time

from micrograd import engine as mg_engine
from micrograd import nn as mg_nn

from course_lib import autograd
from course_lib.data import make_moons


def train(Value, model, X, y, steps):
    """micrograd's demo loop; returns the loss at every step."""
    curve = []
    for k in range(steps):
        inputs = [list(map(Value, row)) for row in X]
        scores = list(map(model, inputs))
        losses = [(1 + -yi * si).relu() for yi, si in zip(y, scores)]
        data_loss = sum(losses) * (1.0 / len(losses))
        reg_loss = 1e-4 * sum(p * p for p in model.parameters())
        loss = data_loss + reg_loss
        model.zero_grad()
        loss.backward()
        lr = 1.0 - 0.9 * k / 100
        for p in model.parameters():
            p.data -= lr * p.grad
        curve.append(loss.data)
    return curve


def timed(Value, model, X, y, steps):
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    curve = train(Value, model, X, y, steps)
    return curve, time.perf_counter() - wall, time.process_time() - cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()

    X, labels = make_moons(100, noise=0.1, seed=0)
    X = X.tolist()
    y = [2 * int(t) - 1 for t in labels]  # labels -1 / +1 for the max-margin loss

    random.seed(1337)
    ours = autograd.MLP(2, [16, 16, 1])
    theirs = mg_nn.MLP(2, [16, 16, 1])
    for p, q in zip(ours.parameters(), theirs.parameters()):
        q.data = p.data  # the same starting point

    curve_ours, wall_ours, cpu_ours = timed(autograd.Value, ours, X, y, args.steps)
    curve_theirs, wall_theirs, cpu_theirs = timed(mg_engine.Value, theirs, X, y, args.steps)

    diff = max(abs(a - b) for a, b in zip(curve_ours, curve_theirs))
    print(f"moons demo, 2-16-16-1 MLP, 100 points, {args.steps} full-batch steps")
    print(f"final loss: course {curve_ours[-1]:.6f}, micrograd {curve_theirs[-1]:.6f}; "
          f"largest loss-curve difference {diff:.1e} ({'within' if diff <= 1e-9 else 'ABOVE'} 1e-9)")
    print(f"course engine: {wall_ours:7.2f} s wall {cpu_ours:7.2f} s CPU")
    print(f"micrograd:     {wall_theirs:7.2f} s wall {cpu_theirs:7.2f} s CPU")
    print(f"speed-up over micrograd: {cpu_theirs / cpu_ours:.1f}x CPU time, {wall_theirs / wall_ours:.1f}x wall time")


if __name__ == "__main__":
    main()
