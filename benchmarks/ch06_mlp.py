"""One epoch of the digits MLP (64-256-256-10, batch 64, Adam) on the chapter 02 tensor engine.

    python benchmarks/ch06_mlp.py numpy|numba|torch     time one backend (one process)
    python benchmarks/ch06_mlp.py both                  the two backends' epochs in turns, in one process
                                                        (as lesson 06 runs them): best of each
Run by benchmarks/ch06_numba_cpu.py, which starts one process per measurement.
"""

import sys
import time

from course_lib.data import load_digits

HIDDEN, BATCH, EPOCHS = 256, 64, 3


def course_model():
    """The MLP and its Adam, on the course's tensor library, from seed 0."""
    from course_lib import tensor as T
    T.manual_seed(0)
    model = T.nn.Sequential(T.nn.Linear(64, HIDDEN), T.nn.ReLU(), T.nn.Linear(HIDDEN, HIDDEN), T.nn.ReLU(),
                            T.nn.Linear(HIDDEN, 10))
    return model, T.optim.Adam(model.parameters(), lr=1e-3)


def course_step(model, opt, xb, yb):
    from course_lib import tensor as T
    loss = T.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def course_epochs(backend):
    from course_lib import tensor as T
    T.set_backend(backend)
    X, _, y, _ = load_digits()
    model, opt = course_model()
    times, loss = [], None
    for epoch in range(EPOCHS):
        start = time.perf_counter()
        for xb, yb in T.DataLoader(X, y, batch_size=BATCH, seed=epoch):
            loss = course_step(model, opt, xb, yb)
        times.append(time.perf_counter() - start)
    return times, loss.item()


def torch_epochs():
    import torch
    torch.manual_seed(0)
    X, _, y, _ = load_digits()
    X, y = torch.tensor(X), torch.tensor(y)
    model = torch.nn.Sequential(torch.nn.Linear(64, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                                torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    times, loss = [], None
    for epoch in range(EPOCHS):
        start = time.perf_counter()
        order = torch.randperm(len(X), generator=g)
        for i in range(0, len(X), BATCH):
            idx = order[i:i + BATCH]
            loss = torch.nn.functional.cross_entropy(model(X[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        times.append(time.perf_counter() - start)
    return times, loss.item()


def both_epochs():
    """The two backends' epochs in turns, in one process: the best of each, after its first epoch."""
    times = {"numpy": [], "numba": []}
    for _ in range(EPOCHS):
        for backend in times:
            times[backend] += course_epochs(backend)[0]  # each call builds a model and trains it
    return [min(t[1:]) for t in times.values()]


if __name__ == "__main__":
    which = sys.argv[1]
    if which == "both":
        print(" ".join(f"{t:.6f}" for t in both_epochs()))
    else:
        times, loss = torch_epochs() if which == "torch" else course_epochs(which)
        # The first epoch pays for compiling (numba) or warming up; report the best later epoch.
        print(f"{min(times[1:]):.6f} {times[0]:.6f} {loss:.4f}")
