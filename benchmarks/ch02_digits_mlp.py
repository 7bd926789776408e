"""Chapter 02 benchmark: the same digits MLP trained with course_lib.tensor and with PyTorch (CPU).

Both use one thread, the same architecture, initial weights, batches, optimizer (Adam)
and float32. Prints the time per epoch of each and the ratio (course / torch), and the
test accuracy of each, so the speed is compared at equal accuracy.

    .venv/bin/python benchmarks/ch02_digits_mlp.py [--epochs 10] [--batch 64]
"""

import argparse
import time

import common

common.pin_threads(1)   # both stacks on one thread, before numpy and torch start their pools

import numpy as np  # noqa: E402
import torch  # noqa: E402

import course_lib.tensor as ct  # noqa: E402
from course_lib.data import load_digits  # noqa: E402

SIZES = (64, 128, 64, 10)


def batches(n, batch, epoch):
    order = np.random.default_rng(epoch).permutation(n)
    return [order[i:i + batch] for i in range(0, n, batch)]


def init_weights(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for a, b in zip(SIZES, SIZES[1:]):
        bound = 1 / np.sqrt(a)
        out.append((rng.uniform(-bound, bound, (b, a)).astype(np.float32),
                    rng.uniform(-bound, bound, b).astype(np.float32)))
    return out


def course_model(weights):
    layers = []
    for W, b in weights:
        lin = ct.nn.Linear(W.shape[1], W.shape[0])
        lin.weight.copy_(ct.Tensor(W))
        lin.bias.copy_(ct.Tensor(b))
        layers += [lin, ct.nn.ReLU()]
    return ct.nn.Sequential(*layers[:-1])


def torch_model(weights):
    layers = []
    for W, b in weights:
        lin = torch.nn.Linear(W.shape[1], W.shape[0])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(W))
            lin.bias.copy_(torch.from_numpy(b))
        layers += [lin, torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def train_course(data, epochs, batch, lr):
    Xtr, Xte, ytr, yte = data
    model = course_model(init_weights())
    opt = ct.optim.Adam(model.parameters(), lr=lr)
    times = []
    for epoch in range(epochs):
        start = time.perf_counter()
        for idx in batches(len(Xtr), batch, epoch):
            loss = ct.cross_entropy(model(ct.Tensor(Xtr[idx])), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        times.append(time.perf_counter() - start)
    with ct.no_grad():
        acc = (model(ct.Tensor(Xte)).numpy().argmax(1) == yte).mean()
    return times, acc


def train_torch(data, epochs, batch, lr):
    Xtr, Xte, ytr, yte = data
    model = torch_model(init_weights())
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    Xtr_t, ytr_t = torch.from_numpy(Xtr), torch.from_numpy(ytr)
    times = []
    for epoch in range(epochs):
        start = time.perf_counter()
        for idx in batches(len(Xtr), batch, epoch):
            idx = torch.from_numpy(idx)
            loss = torch.nn.functional.cross_entropy(model(Xtr_t[idx]), ytr_t[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        times.append(time.perf_counter() - start)
    with torch.no_grad():
        acc = (model(torch.from_numpy(Xte)).argmax(1).numpy() == yte).mean()
    return times, acc


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = load_digits()
    # alternate the two so that machine noise hits both alike; take the median epoch
    ours, acc_ours = train_course(data, args.epochs, args.batch, args.lr)
    theirs, acc_theirs = train_torch(data, args.epochs, args.batch, args.lr)
    ours2, _ = train_course(data, args.epochs, args.batch, args.lr)
    theirs2, _ = train_torch(data, args.epochs, args.batch, args.lr)
    t_ours, t_theirs = np.median(ours + ours2), np.median(theirs + theirs2)
    print(f"digits MLP {SIZES}, batch {args.batch}, Adam lr {args.lr}, {args.epochs} epochs, 1 thread")
    print(f"course_lib.tensor (numpy backend): {t_ours * 1e3:7.1f} ms/epoch   test acc {acc_ours:.3f}")
    print(f"PyTorch {torch.__version__:>12s} (CPU): {t_theirs * 1e3:7.1f} ms/epoch   test acc {acc_theirs:.3f}")
    print(f"ratio course / torch: {t_ours / t_theirs:.2f}x")


if __name__ == "__main__":
    main()
