"""Checks for chapter 02: tensors, broadcasting, autograd rules, modules, optimizers, training.

Oracles: PyTorch in float64 (values and gradients) and numpy."""

import numpy as np
import torch

from course_lib.checks import CheckFailed, assert_close, assert_equal, exercise, fmt, random_array, random_shape, require, rng


def _t(x, grad=False):
    return torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=grad)


# ------------------------------------------------------------------ strides

@exercise
def strides(contiguous_strides, index_to_position):
    """Row-major strides of a shape, and the storage position of an index, against numpy."""
    n = 0
    for ndim in (1, 2, 3, 4):
        shape = random_shape(ndim, 2, 7)
        a = np.empty(shape)
        expected = tuple(s // a.itemsize for s in a.strides)
        yours = contiguous_strides(shape)
        require(yours is not None, "contiguous_strides returned None. Did you forget a `return`?")
        assert_equal(tuple(int(s) for s in yours), expected, what=f"contiguous_strides({shape})",
                     hint="the last dim has stride 1; each dim's stride is the product of the sizes after it."
                     if tuple(yours) != tuple(reversed(expected)) else
                     "reversed: in row-major order the LAST dim moves fastest (stride 1).")
        # positions in a permuted, offset view: compare with numpy's own address arithmetic
        perm = tuple(rng().permutation(ndim).tolist())
        strides_p = tuple(expected[i] for i in perm)
        shape_p = tuple(shape[i] for i in perm)
        offset = int(rng().integers(0, 5))
        for _ in range(4):
            index = tuple(int(rng().integers(0, s)) for s in shape_p)
            exp = offset + int(np.dot(index, strides_p))
            got = index_to_position(index, strides_p, offset)
            require(got is not None, "index_to_position returned None. Did you forget a `return`?")
            hint = None
            if got == int(np.dot(index, strides_p)):
                hint = "you forgot to add the offset."
            elif got == offset + int(np.dot(index, tuple(reversed(strides_p)))):
                hint = "pair index[i] with strides[i], not with the reversed strides."
            assert_equal(int(got), exp, what=f"index_to_position({index}, strides={strides_p}, offset={offset})",
                         hint=hint or "position = offset + sum(index[i] * strides[i]).")
            n += 1
    return f"4 random shapes, {n} indices into permuted views"


# ------------------------------------------------------------------ broadcasting

def _np_broadcast(a, b):
    try:
        return np.broadcast_shapes(a, b)
    except ValueError:
        return None


@exercise
def broadcast_shape(broadcast_shape):
    """The broadcast shape of two shapes (numpy's rules), and a ValueError when they clash."""
    cases = [((1,), (1,))]
    for _ in range(12):
        big = random_shape(int(rng().integers(1, 5)), 2, 6)
        keep = int(rng().integers(0, len(big) + 1))
        small = tuple(1 if rng().random() < 0.4 else n for n in big[len(big) - keep:])
        cases.append((big, small) if rng().random() < 0.5 else (small, big))
    clash = random_shape(2, 2, 5)
    cases.append((clash, (clash[0], clash[1] + 1)))
    cases.append(((3, 1, clash[1]), (clash[1] + 1,)))
    for a, b in cases:
        expected = _np_broadcast(a, b)
        if expected is None:
            try:
                got = broadcast_shape(a, b)
            except ValueError:
                continue
            raise CheckFailed(f"broadcast_shape({a}, {b}) returned {got}, but these shapes do not broadcast."
                              "\n  hint: raise ValueError when two aligned sizes differ and neither is 1.")
        got = broadcast_shape(a, b)
        require(got is not None, "broadcast_shape returned None. Did you forget a `return`?")
        hint = "align the shapes on the RIGHT (pad the shorter one with 1s on the left)."
        if tuple(got) == tuple(max(x, y) for x, y in zip(a, b)):
            hint = "zip stops at the shorter shape: align on the right and pad the shorter one with 1s."
        assert_equal(tuple(int(n) for n in got), tuple(expected), what=f"broadcast_shape({a}, {b})", hint=hint)
    return f"{len(cases)} random pairs, 2 that clash"


# ------------------------------------------------------------------ backward rules (numpy)

def _pair():
    big = random_shape(3, 2, 5)
    small = (big[1], 1) if rng().random() < 0.5 else (1, big[2])
    return big, small


def _sum_to(x, shape):
    """numpy: sum x over the dims that broadcasting added to `shape`."""
    while x.ndim > len(shape):
        x = x.sum(0)
    return x.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1), keepdims=True)


@exercise
def mul_backward(mul_backward):
    """Gradients of a * b with broadcasting, summed back to each operand's shape, vs torch."""
    for swap in (False, True, False):
        big, small = _pair()
        sa, sb = (small, big) if swap else (big, small)
        a, b = random_array(sa), random_array(sb)
        out_shape = np.broadcast_shapes(sa, sb)
        g = random_array(out_shape)
        ta, tb = _t(a, True), _t(b, True)
        (ta * tb).backward(_t(g))
        got = mul_backward(a, b, g)
        require(isinstance(got, tuple) and len(got) == 2, f"mul_backward should return (grad_a, grad_b), got {fmt(got)}")
        ga, gb = got
        unreduced = "broadcast grads must be summed back to the operand's shape (sum over the broadcast dims)."
        for name, yours, exp, mine, other in (("grad_a", ga, ta.grad, a, b), ("grad_b", gb, tb.grad, b, a)):
            assert_close(yours, exp.numpy(), what=f"{name} for a {sa} * b {sb}", rtol=1e-9, atol=1e-12,
                         inputs={"a.shape": sa, "b.shape": sb},
                         mistakes={unreduced: g * other,
                                   "the gradient of one operand is grad times the OTHER operand":
                                   _sum_to(g * mine, mine.shape)})
    return "3 random broadcast cases"


def _try(f):
    """A known mistake's output, or None when that mistake cannot even run on these shapes."""
    try:
        return f()
    except Exception:
        return None


@exercise
def matmul_backward(matmul_backward):
    """Gradients of a @ b for 2-D and batched 3-D inputs, vs torch."""
    n = int(rng().integers(3, 7))
    shapes = [((n, n), (n, n)), ((3, 5), (5, 4)), ((2, 3, 5), (2, 5, 4))]
    for sa, sb in shapes:
        a, b = random_array(sa), random_array(sb)
        ta, tb = _t(a, True), _t(b, True)
        out = ta @ tb
        g = random_array(tuple(out.shape))
        out.backward(_t(g))
        got = matmul_backward(a, b, g)
        require(isinstance(got, tuple) and len(got) == 2, f"matmul_backward should return (grad_a, grad_b), got {fmt(got)}")
        ga, gb = got
        bt, at = np.swapaxes(b, -1, -2), np.swapaxes(a, -1, -2)
        assert_close(ga, ta.grad.numpy(), what=f"grad_a for a {sa} @ b {sb}", rtol=1e-9,
                     mistakes={"missing transpose: grad_a = grad @ b^T (swap b's last two axes)": _try(lambda: g @ b),
                               "wrong order: grad_a = grad @ b^T, not b^T @ grad": _try(lambda: bt @ g)},
                     hint="shapes guide you: grad is (n, m), b is (k, m), grad_a must be (n, k).")
        assert_close(gb, tb.grad.numpy(), what=f"grad_b for a {sa} @ b {sb}", rtol=1e-9,
                     mistakes={"missing transpose: grad_b = a^T @ grad (swap a's last two axes)": _try(lambda: a @ g),
                               "wrong order: grad_b = a^T @ grad, not grad @ a^T": _try(lambda: g @ at)},
                     hint="shapes guide you: a is (n, k), grad is (n, m), grad_b must be (k, m).")
    return "square, rectangular and batched cases"


@exercise
def sum_mean_backward(sum_backward, mean_backward):
    """The gradient of x.sum(dim, keepdim) and x.mean(dim, keepdim) w.r.t. x, vs torch."""
    n = 0
    for keepdim in (False, True):
        for i in range(2):
            shape = random_shape(3, 2, 6)
            dim = int(rng().integers(1 if i == 0 else 0, 3))  # one dim after the first, always: for dim 0
            # without keepdim, broadcasting g without putting the dim back happens to give the right answer
            x = random_array(shape)
            for name, fn, tfn in (("sum", sum_backward, torch.sum), ("mean", mean_backward, torch.mean)):
                tx = _t(x, True)
                out = tfn(tx, dim=dim, keepdim=keepdim)
                g = random_array(tuple(out.shape))
                out.backward(_t(g))
                yours = fn(g, shape, dim, keepdim)
                expand = np.broadcast_to(np.expand_dims(g, dim) if not keepdim else g, shape)
                assert_close(yours, tx.grad.numpy(), what=f"{name}_backward for x {shape}, dim={dim}, keepdim={keepdim}",
                             rtol=1e-9,
                             mistakes={"mean's gradient is grad / n, where n = shape[dim] (the count averaged)": expand,
                                       "divide by the size of the reduced dim only, not by the whole size":
                                       expand / np.prod(shape)},
                             hint="without keepdim, first put the reduced dim back (np.expand_dims), "
                                  "then broadcast to the input shape." if not keepdim else None)
                n += 1
    return f"{n} random cases, with and without keepdim"


# ------------------------------------------------------------------ softmax and cross-entropy

@exercise
def softmax_cross_entropy(log_softmax, cross_entropy):
    """Stable log_softmax over the last axis and mean cross-entropy, vs torch, with huge logits."""
    for scale in (1.0, 30.0, 1000.0):
        batch, classes = int(rng().integers(3, 9)), int(rng().integers(3, 11))
        x = random_array((batch, classes)) * scale
        target = rng().integers(0, classes, batch)
        tx = _t(x)
        expected = torch.log_softmax(tx, -1).numpy()
        with np.errstate(all="ignore"):
            naive = np.log(np.exp(x) / np.exp(x).sum(-1, keepdims=True))
            wrong_axis = x - np.log(np.exp(x - x.max()).sum(0, keepdims=True)) - x.max()
            yours = log_softmax(x)
        finite = yours is not None and np.isfinite(np.asarray(yours, dtype=np.float64)).all()
        require(yours is None or finite,
                f"your log_softmax gave inf or nan on logits up to {np.abs(x).max():.0f}: it is unstable, "
                "exp overflows for large logits.",
                hint="subtract the row max m first: x - m - log(sum(exp(x - m))).")
        assert_close(yours, expected, what=f"log_softmax of logits with scale {scale:g}", rtol=1e-9, atol=1e-9,
                     mistakes={"unstable: exp overflows for large logits. Subtract the row max first": naive,
                               "normalise over the last axis (axis=-1, keepdims=True), one row per example":
                               wrong_axis},
                     hint="log_softmax(x) = x - m - log(sum(exp(x - m))) with m the row max.")
        with np.errstate(all="ignore"):
            ce = cross_entropy(x, target)
        exp_ce = torch.nn.functional.cross_entropy(tx, torch.tensor(target)).item()
        assert_close(ce, exp_ce, what=f"cross_entropy with scale {scale:g}", rtol=1e-9,
                     mistakes={"take the MEAN over the batch, not the sum": exp_ce * batch,
                               "cross-entropy is MINUS the log-probability of the target": -exp_ce},
                     hint="pick log_softmax(x)[i, target[i]] for each row i, negate, average.")
    return "3 batches, logits up to 1000"


# ------------------------------------------------------------------ Linear module

@exercise
def linear(Linear):
    """A Linear(in, out) module: weight (out, in), bias (out,), y = x @ W^T + b; values and grads vs torch."""
    import course_lib.tensor as ct

    for in_f, out_f, lead in ((5, 3, (4,)), (7, 6, (2, 3))):
        ct.manual_seed(int(rng().integers(0, 1000)))
        layer = Linear(in_f, out_f)
        params = dict(layer.named_parameters())
        require(set(params) == {"weight", "bias"},
                f"Linear should have parameters 'weight' and 'bias' (as nn.Parameter), found {sorted(params)}.",
                hint="assign them as attributes: self.weight = Parameter(...), self.bias = Parameter(...).")
        assert_equal(layer.weight.shape, (out_f, in_f), what="weight.shape",
                     hint="torch's layout: weight is (out_features, in_features).")
        assert_equal(layer.bias.shape, (out_f,), what="bias.shape")
        bound = 1 / np.sqrt(in_f)
        w = layer.weight.numpy()
        require(np.abs(w).max() <= bound + 1e-6 and np.abs(w).max() > bound / 4 and w.std() > 0,
                f"weights should start uniform in [-1/sqrt(in), 1/sqrt(in)] = ±{bound:.3f}; "
                f"yours range over [{w.min():.3f}, {w.max():.3f}].",
                hint="draw them from the course's generator, ct.generator().uniform(-bound, bound, shape).")
        x = random_array(lead + (in_f,)).astype(np.float32)
        xt = ct.Tensor(x, requires_grad=True)
        y = layer(xt)
        tw, tb = _t(layer.weight.numpy(), True), _t(layer.bias.numpy(), True)
        tx = _t(x, True)
        ty = tx @ tw.T + tb
        g = random_array(tuple(ty.shape))
        ty.backward(_t(g))
        assert_close(y.numpy(), ty.detach().numpy(), what=f"Linear({in_f}, {out_f}) output for x {x.shape}",
                     rtol=1e-5, atol=1e-5,
                     mistakes={"you forgot the bias": (tx @ tw.T).detach().numpy()})
        (y * ct.Tensor(g.astype(np.float32))).sum().backward()
        require(layer.weight.grad is not None and layer.bias.grad is not None,
                "no gradient reached weight or bias: build y from them with tensor ops (x @ self.weight.T + self.bias).")
        assert_close(layer.weight.grad.numpy(), tw.grad.numpy(), what="weight.grad", rtol=1e-4, atol=1e-4)
        assert_close(layer.bias.grad.numpy(), tb.grad.numpy(), what="bias.grad", rtol=1e-4, atol=1e-4)
        assert_close(xt.grad.numpy(), tx.grad.numpy(), what="the input's grad", rtol=1e-4, atol=1e-4)
    return "2 random layers, values and gradients"


# ------------------------------------------------------------------ optimizer steps

@exercise
def optimizer_steps(sgd_momentum_step, adam_step):
    """Five steps of SGD with momentum and of Adam (bias-corrected) against torch.optim."""
    shape = random_shape(2, 2, 6)
    p0 = random_array(shape)
    grads = [random_array(shape) for _ in range(5)]
    lr, mom = 0.1, 0.9
    tp = _t(p0, True)
    topt = torch.optim.SGD([tp], lr=lr, momentum=mom)
    p, v = p0.copy(), np.zeros(shape)
    for t, g in enumerate(grads, 1):
        tp.grad = _t(g)
        topt.step()
        got = sgd_momentum_step(p, g, v, lr, mom)
        require(isinstance(got, tuple) and len(got) == 2, f"sgd_momentum_step returns (p, v), got {fmt(got)}")
        no_mom = p - lr * g
        p, v = got
        assert_close(p, tp.detach().numpy(), what=f"the parameter after SGD-momentum step {t}", rtol=1e-9,
                     mistakes={"you ignored the velocity: p = p - lr * v, where v = momentum * v + g": no_mom})
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, 0.01
    tp = _t(p0, True)
    topt = torch.optim.Adam([tp], lr=lr, betas=(b1, b2), eps=eps)
    p, m, v = p0.copy(), np.zeros(shape), np.zeros(shape)
    for t, g in enumerate(grads, 1):
        tp.grad = _t(g)
        topt.step()
        m_exp, v_exp = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        uncorrected = p - lr * m_exp / (np.sqrt(v_exp) + eps)
        got = adam_step(p, g, m, v, t, lr, b1, b2, eps)
        require(isinstance(got, tuple) and len(got) == 3, f"adam_step returns (p, m, v), got {fmt(got)}")
        p, m, v = got
        assert_close(p, tp.detach().numpy(), what=f"the parameter after Adam step {t}", rtol=1e-9,
                     mistakes={"Adam without bias correction: divide m by (1 - b1**t) and v by (1 - b2**t)": uncorrected})
    return "5 steps of each on a random parameter"


# ------------------------------------------------------------------ the training loop

@exercise
def training_loop(train_epoch):
    """One epoch of your loop on a small MLP must update the weights exactly as torch's loop does."""
    import course_lib.tensor as ct
    from course_lib.tensor import nn, optim

    sizes = (6, int(rng().integers(5, 9)), 3)
    x = random_array((37, sizes[0])).astype(np.float32)
    y = rng().integers(0, 3, 37)
    model = nn.Sequential(nn.Linear(sizes[0], sizes[1]), nn.ReLU(), nn.Linear(sizes[1], sizes[2]))
    tmodel = torch.nn.Sequential(torch.nn.Linear(sizes[0], sizes[1]), torch.nn.ReLU(),
                                 torch.nn.Linear(sizes[1], sizes[2]))
    with torch.no_grad():
        for p, tp in zip(model.parameters(), tmodel.parameters()):
            tp.copy_(torch.tensor(p.numpy()))
    before = [p.numpy() for p in model.parameters()]
    seed = int(rng().integers(0, 1000))
    loader = ct.DataLoader(x, y, batch_size=8, seed=seed)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    mean_loss = train_epoch(model, loader, opt)
    # torch, same batches in the same order
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.1, momentum=0.9)
    order = np.random.default_rng(seed).permutation(len(x))
    losses = []
    for i in range(0, len(x), 8):
        idx = order[i:i + 8]
        loss = torch.nn.functional.cross_entropy(tmodel(torch.tensor(x[idx])), torch.tensor(y[idx]))
        topt.zero_grad()
        loss.backward()
        topt.step()
        losses.append(loss.item())
    after = [p.numpy() for p in model.parameters()]
    require(any(not np.allclose(a, b) for a, b in zip(before, after)),
            "the weights did not change: call opt.step() after loss.backward().")
    for (name, p), tp in zip(model.named_parameters(), tmodel.parameters()):
        assert_close(p.numpy(), tp.detach().numpy(), what=f"{name} after one epoch", rtol=1e-3, atol=1e-4,
                     hint="per batch: loss = cross_entropy(model(x), y); opt.zero_grad(); loss.backward(); opt.step(). "
                          "Forgetting zero_grad makes gradients pile up across batches.")
    assert_close(mean_loss, np.mean(losses), what="the mean batch loss your function returned", rtol=1e-4,
                 hint="return the mean of loss.item() over the batches.")
    return f"1 epoch, {len(losses)} batches, weights match torch"
