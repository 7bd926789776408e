"""Checks for chapter 02: broadcasting, the strided zip and reduce, a Function and the Tensor methods
that call it, backward rules, softmax, modules and optimizers.

Oracles: PyTorch in float64 (values and gradients), numpy, and chapter 00's gradient check."""

import numpy as np
import torch

from course_lib.checks import CheckFailed, assert_close, assert_equal, exercise, fmt, random_array, random_shape, require, rng


def _t(x, grad=False):
    return torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=grad)


# ------------------------------------------------------------------ broadcasting

def _np_broadcast(a, b):
    try:
        return np.broadcast_shapes(a, b)
    except ValueError:
        return None


@exercise
def broadcast_shape(your_broadcast_shape):
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
                got = your_broadcast_shape(a, b)
            except ValueError:
                continue
            raise CheckFailed(f"broadcast_shape({a}, {b}) returned {got}, but these shapes do not broadcast."
                              "\n  hint: raise ValueError when two aligned sizes differ and neither is 1.")
        got = your_broadcast_shape(a, b)
        require(got is not None, "broadcast_shape returned None. Did you forget a `return`?")
        hint = "align the shapes on the RIGHT (pad the shorter one with 1s on the left)."
        if tuple(got) == tuple(max(x, y) for x, y in zip(a, b)):
            hint = "zip stops at the shorter shape: align on the right and pad the shorter one with 1s."
        assert_equal(tuple(int(n) for n in got), tuple(expected), what=f"broadcast_shape({a}, {b})", hint=hint)
    return f"{len(cases)} random pairs, 2 that clash"


# ------------------------------------------------------------------ strided loops: zip and reduce

def _lib():
    from course_lib.tensor.tensor_data import TensorData, slice_view
    return TensorData, slice_view


def _strided_case(shape, kind, dtype=np.float64):
    """(TensorData view, the same values as a numpy array) for a random array of `shape`.

    kind: "plain"; "transposed" (a permutation of a contiguous base, so not in storage order);
    "sliced" (every other element of a bigger base, from offset 1 onwards: strides x2, offset > 0);
    "expanded" (one dim broadcast from size 1 with stride 0). The numpy side is built with
    numpy's own transpose / slicing / broadcast_to, independently of the course's TensorData."""
    TensorData, slice_view = _lib()
    shape = tuple(shape)
    n = len(shape)
    if kind == "transposed" and n >= 2:
        order = [int(i) for i in rng().permutation(n)]
        if order == list(range(n)):
            order = order[::-1]
        base_shape = [0] * n
        for k, d in enumerate(order):
            base_shape[d] = shape[k]
        base = random_array(tuple(base_shape)).astype(dtype)
        return TensorData.from_numpy(base, dtype).permute(*order), np.transpose(base, order)
    if kind == "sliced":
        base = random_array(tuple(2 * s + 1 for s in shape)).astype(dtype)
        key = tuple(slice(1, 1 + 2 * s, 2) for s in shape)
        return slice_view(TensorData.from_numpy(base, dtype), key), base[key]
    if kind == "expanded" and any(s > 1 for s in shape):
        d = int(rng().choice([i for i, s in enumerate(shape) if s > 1]))
        small = tuple(1 if i == d else s for i, s in enumerate(shape))
        base = random_array(small).astype(dtype)
        return TensorData.from_numpy(base, dtype).expand(shape), np.broadcast_to(base, shape)
    base = random_array(shape).astype(dtype)
    return TensorData.from_numpy(base, dtype), base


def _call(run, what, hint):
    """Run the learner's code; an exception becomes a CheckFailed that says where, with a hint."""
    try:
        return run()
    except (CheckFailed, NotImplementedError):
        raise
    except Exception as e:
        raise CheckFailed(f"{what}: your code raised {type(e).__name__}: {e}\n  hint: {hint}") from None


def _describe(td):
    return f"shape {td.shape}, strides {td.strides}, offset {td.offset}"


def _read(td, offset=None, strides=None):
    """numpy's reading of a view with a wrong offset or wrong strides (to name a mistake)."""
    item = td.storage.itemsize
    strides = td.strides if strides is None else strides
    start = td.offset if offset is None else offset
    need = start + sum((n - 1) * s for n, s in zip(td.shape, strides)) + 1
    if need > td.storage.size:
        return None
    return np.lib.stride_tricks.as_strided(td.storage[start:], td.shape, [s * item for s in strides]).copy()


def _contiguous(shape):
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def _check_fresh(out, shape, dtype, name):
    TensorData, _ = _lib()
    require(out is not None, f"{name} returned None. Did you forget a `return`?")
    require(isinstance(out, TensorData), f"{name} should return a TensorData, got {type(out).__name__}.",
            hint="the output is a fresh, contiguous TensorData of the output's shape.")
    assert_equal(tuple(out.shape), tuple(shape), what=f"the shape of {name}'s output")
    require(out.is_contiguous() and out.offset == 0,
            f"{name}'s output should be fresh and contiguous; yours has {_describe(out)}.")
    require(out.dtype == dtype, f"{name}'s output has dtype {out.dtype}, expected {np.dtype(dtype)}.",
            hint="the output's dtype is np.result_type of the inputs' dtypes (float32 stays float32).")


_SUB = lambda x, y: x - y            # noqa: E731  (not symmetric: swapped operands show)
_MIX = lambda x, y: x * y + 2.0 * x  # noqa: E731


@exercise
def strided_zip(your_strided_zip):
    """zip over strided, broadcast views (transposed, sliced, stride-0) vs numpy's broadcasting."""
    n_cases = 0
    r, c, k = (int(v) for v in rng().integers(2, 6, 3))
    cases = [((r, c), (r, c), "transposed", "sliced", _SUB, np.float64),
             ((r, c), (c,), "sliced", "plain", _MIX, np.float64),
             ((r, 1, k), (c, 1), "transposed", "sliced", _SUB, np.float64),
             ((1,), (r, c), "plain", "expanded", _MIX, np.float64),
             ((c, r), (r,), "transposed", "plain", _SUB, np.float32)]
    for sa, sb, ka, kb, f, dtype in cases:
        a, a_np = _strided_case(sa, ka, dtype)
        b, b_np = _strided_case(sb, kb, dtype)
        before = (a.storage.copy(), b.storage.copy())
        shape = np.broadcast_shapes(sa, sb)
        inputs = {"a": _describe(a), "b": _describe(b)}
        out = _call(lambda: your_strided_zip(f, a, b), f"strided_zip for a {sa} ({ka}) and b {sb} ({kb})",
                    "an index went past an input's shape? Align the shapes on the right: the output's extra "
                    "leading dims are skipped, and an input's dim of size 1 always reads index 0.")
        _check_fresh(out, shape, np.result_type(a.dtype, b.dtype), "strided_zip")
        require(np.array_equal(a.storage, before[0]) and np.array_equal(b.storage, before[1]),
                "strided_zip changed an input's storage; write only into the output.")
        expected = f(a_np, b_np)
        mistakes = {"f(a[i], b[i]) takes a's element first; yours are swapped": f(b_np, a_np)}
        for name, td, other, first in (("a", a, b_np, True), ("b", b, a_np, False)):
            for why, wrong in ((f"you ignored {name}'s offset: position = offset + sum(index[i] * strides[i])",
                                _read(td, offset=0)),
                               (f"you read {name} in storage order, ignoring its strides (a transposed or sliced "
                                "view is not in storage order)", _read(td, strides=_contiguous(td.shape)))):
                if wrong is not None and not np.array_equal(wrong, _read(td)):
                    mistakes[why] = f(wrong, other) if first else f(other, wrong)
        assert_close(out.to_numpy(), expected, what=f"strided_zip for a {sa} ({ka}) and b {sb} ({kb})",
                     rtol=1e-6 if dtype == np.float32 else 1e-12, atol=1e-6 if dtype == np.float32 else 1e-12,
                     inputs=inputs, mistakes=mistakes,
                     hint="align the shapes on the right: an input's dim of size 1 reads index 0, and the output's "
                          "extra leading dims are skipped; then read through that input's own strides and offset.")
        n_cases += 1
    return f"{n_cases} random pairs of views: transposed, sliced, broadcast, float32 and float64"


@exercise
def strided_reduce(your_strided_reduce):
    """reduce along one dim (keepdim) over strided views vs numpy, with an order-dependent fold too."""
    fold = lambda acc, x: 0.5 * acc + x  # noqa: E731  (the order of the elements matters)
    n_cases = 0
    for ndim, kind, (f, start, name) in ((3, "transposed", (lambda acc, x: acc + x, 0.0, "sum")),
                                        (2, "sliced", (max, -np.inf, "max")),
                                        (3, "sliced", (fold, 1.0, "fold")),
                                        (3, "expanded", (lambda acc, x: acc + x, 0.0, "sum"))):
        shape = random_shape(ndim, 2, 5)
        a, a_np = _strided_case(shape, kind)
        dim = int(rng().integers(0, ndim)) if n_cases != 2 else 1
        before = a.storage.copy()
        out = _call(lambda: your_strided_reduce(f, start, a, dim), f"strided_reduce of a {shape} ({kind}) over dim {dim}",
                    "the output has a's shape with shape[dim] = 1; for each of its indices, walk index[dim] "
                    "over 0..a.shape[dim]-1.")
        keep = tuple(1 if i == dim else s for i, s in enumerate(shape))
        inputs = {"a": _describe(a), "dim": dim}
        if out is not None and hasattr(out, "shape") and tuple(out.shape) != keep:
            others = [d for d in range(ndim) if d != dim and tuple(1 if i == d else s for i, s in enumerate(shape))
                      == tuple(out.shape)]
            hint = (f"your output keeps dim {others[0]} with size 1: reduce dim {dim}, the one you are given."
                    if others else "keep the reduced dim with size 1 (keepdim): the output's shape is a's shape with "
                    "shape[dim] = 1." if len(out.shape) != len(shape) else None)
            assert_equal(tuple(out.shape), keep, what=f"the shape of strided_reduce's output for a {shape}, dim={dim}",
                         inputs=inputs, hint=hint)
        _check_fresh(out, keep, a.dtype, "strided_reduce")
        require(np.array_equal(a.storage, before), "strided_reduce changed its input's storage.")
        acc, backwards, no_start = np.full(keep, start), np.full(keep, start), None
        for i in range(shape[dim]):
            acc = f(acc, np.take(a_np, [i], axis=dim)) if name != "max" else np.maximum(acc, np.take(a_np, [i], axis=dim))
            if name == "fold":
                backwards = fold(backwards, np.take(a_np, [shape[dim] - 1 - i], axis=dim))
                no_start = np.take(a_np, [0], axis=dim) if i == 0 else fold(no_start, np.take(a_np, [i], axis=dim))
        mistakes = {}
        if name == "fold":
            mistakes = {"fold the elements in order k = 0, 1, ..., n-1": backwards,
                        "start the fold from `start`, then combine every element": no_start}
        assert_close(out.to_numpy(), acc, what=f"strided_reduce ({name}) of a {shape} ({kind}) over dim {dim}",
                     rtol=1e-12, atol=1e-12, inputs=inputs, mistakes=mistakes,
                     hint="each output element folds a whole line of a along dim, in order, read through a's own "
                          "strides and offset.")
        n_cases += 1
    return f"{n_cases} random views (transposed, sliced, stride-0), sum, max and an order-dependent fold"


# ------------------------------------------------------------------ your Functions and Tensor methods

def _leaf(values, transposed=False):
    """A float64 leaf Tensor holding `values`; transposed: stored as the transpose, so not contiguous."""
    import course_lib.tensor as ct
    TensorData, _ = _lib()
    if transposed and values.ndim >= 2:
        order = list(range(values.ndim))[::-1]
        td = TensorData.from_numpy(np.ascontiguousarray(np.transpose(values, order)), np.float64).permute(*order)
    else:
        td = TensorData.from_numpy(values, np.float64)
    return ct.Tensor._wrap(td, True)


def _gradient_check(f, grad_f, x, what):
    """Chapter 00's gradient check as a second oracle: the worst relative error against nudging."""
    from course_lib.gradcheck import gradient_check
    err = gradient_check(f, grad_f, x)
    require(err < 1e-6, f"{what}: your backward disagrees with the numerical gradient (chapter 00's gradient "
            f"check): worst relative error {err:.2e}, expected below 1e-6.")


@exercise
def mul_function(your_Mul):
    """Mul.forward (raw TensorData from your zip) and Mul.backward with broadcasting, vs torch float64,
    on non-contiguous inputs, plus chapter 00's gradient check."""
    import course_lib.tensor as ct
    from course_lib.tensor.autodiff import Context
    TensorData, _ = _lib()
    r, c = (int(v) for v in rng().integers(2, 6, 2))
    cases = [((r, c), (c,), True, False), ((r, 1), (1, c), False, False), ((2, r, c), (r, 1), False, True),
             ((c, r), (c, r), True, True)]
    for sa, sb, ta_, tb_ in cases:
        a_np, b_np = random_array(sa), random_array(sb)
        a, b = _leaf(a_np, ta_), _leaf(b_np, tb_)
        raw = your_Mul.forward(Context("Mul", (True, True)), a, b)
        require(isinstance(raw, TensorData), f"Mul.forward should return raw TensorData (what strided_zip "
                f"returns), got {type(raw).__name__}; Function.apply wraps it in a Tensor.")
        out = your_Mul.apply(a, b)
        ta, tb = _t(a_np, True), _t(b_np, True)
        tout = ta * tb
        assert_close(out.numpy(), tout.detach().numpy(), what=f"Mul.apply(a {sa}, b {sb})", rtol=1e-12, atol=1e-12)
        g = random_array(tuple(tout.shape))
        tout.backward(_t(g))
        out.backward(ct.Tensor(g))
        for name, yours, exp, other, mine in (("a.grad", a.grad, ta.grad, b_np, a_np), ("b.grad", b.grad, tb.grad, a_np, b_np)):
            require(yours is not None, f"{name} is None: Mul.backward should return (grad_a, grad_b).")
            assert_close(yours.numpy(), exp.numpy(), what=f"{name} for a {sa} * b {sb}", rtol=1e-9, atol=1e-12,
                         inputs={"a.shape": sa, "b.shape": sb},
                         mistakes={"each operand's gradient is grad times the OTHER operand":
                                   _sum_to(np.broadcast_to(g * mine, g.shape), mine.shape)
                                   if np.broadcast_shapes(mine.shape, g.shape) == g.shape else None})

        def loss(x, b_np=b_np, g=g):
            return float((your_Mul.apply(ct.Tensor(x), ct.Tensor(b_np)).numpy() * g).sum())

        def grad(x, b_np=b_np, g=g):
            t = ct.Tensor(x, requires_grad=True)
            your_Mul.apply(t, ct.Tensor(b_np)).backward(ct.Tensor(g))
            return t.grad.numpy()

        _gradient_check(loss, grad, a_np, f"d/da of a {sa} * b {sb}")
    return f"{len(cases)} broadcast cases on transposed views, values, gradients and gradient check"


@exercise
def sum_function(your_Sum):
    """Sum.forward (raw TensorData from your reduce, keepdim) and Sum.backward, vs torch float64,
    on non-contiguous inputs, plus chapter 00's gradient check."""
    import course_lib.tensor as ct
    from course_lib.tensor.autodiff import Context
    TensorData, _ = _lib()
    n = 0
    for ndim, transposed in ((2, True), (3, True), (3, False)):
        shape = random_shape(ndim, 2, 5)
        dim = int(rng().integers(0, ndim)) if n else 1
        x_np = random_array(shape)
        x = _leaf(x_np, transposed)
        raw = your_Sum.forward(Context("Sum", (True,)), x, dim)
        require(isinstance(raw, TensorData), f"Sum.forward should return raw TensorData (what strided_reduce "
                f"returns), got {type(raw).__name__}.")
        out = your_Sum.apply(x, dim=dim)
        tx = _t(x_np, True)
        tout = tx.sum(dim, keepdim=True)
        assert_equal(out.shape, tuple(tout.shape), what=f"the shape of Sum.apply(x {shape}, dim={dim})",
                     hint="Sum keeps the summed dim with size 1, as strided_reduce does.")
        assert_close(out.numpy(), tout.detach().numpy(), what=f"Sum.apply(x {shape}, dim={dim})", rtol=1e-12, atol=1e-12)
        g = random_array(tuple(tout.shape))
        tout.backward(_t(g))
        _call(lambda: out.backward(ct.Tensor(g)), f"Sum.backward for x {shape} summed over dim {dim}",
              f"backward gets grad of shape {tuple(tout.shape)} and must return one of x's shape {shape}: every "
              "element of x gets the gradient of the sum it went into, so copy grad back along the summed dim "
              "(a view, as broadcasting makes in the lesson).")
        assert_close(x.grad.numpy(), tx.grad.numpy(), what=f"x.grad for x {shape} summed over dim {dim}",
                     rtol=1e-9, atol=1e-12,
                     mistakes={"each input element adds to its sum with weight 1, not 1/n: no division":
                               np.broadcast_to(g, shape) / shape[dim]})

        def loss(v, dim=dim, g=g):
            return float((your_Sum.apply(ct.Tensor(v), dim=dim).numpy() * g).sum())

        def grad(v, dim=dim, g=g):
            t = ct.Tensor(v, requires_grad=True)
            your_Sum.apply(t, dim=dim).backward(ct.Tensor(g))
            return t.grad.numpy()

        _gradient_check(loss, grad, x_np, f"d/dx of x {shape}.sum({dim})")
        n += 1
    return f"{n} random views and dims, values, gradients and gradient check"


def _graph_fns(t):
    from course_lib.tensor.autodiff import topological_order
    return [node._fn for node in topological_order(t) if node._fn is not None]


@exercise
def tensor_methods(your_Tensor):
    """Your Tensor's *, reversed * and sum(dim, keepdim) call your Functions; values and gradients vs torch."""
    import course_lib.tensor as ct
    from course_lib.tensor import functions as F
    require(isinstance(your_Tensor, type) and issubclass(your_Tensor, ct.Tensor),
            "Tensor should be a subclass of the library's ct.Tensor (class Tensor(ct.Tensor): ...).")
    r, c, k = (int(v) for v in rng().integers(2, 6, 3))

    def mine(values, transposed=False):
        leaf = _leaf(values, transposed)
        return your_Tensor._wrap(leaf.data, True)

    def compare(what, make, tmake, leaves, lib_fn, hint=None):
        ts = [mine(v, tr) for v, tr in leaves]
        out = _call(lambda: make(*ts), what, hint or "see the exercise's text.")
        require(out is not None, f"{what} returned None. Did you forget a `return`?")
        fns = _graph_fns(out)
        require(lib_fn not in fns and any(fn.__name__ == lib_fn.__name__ for fn in fns),
                f"{what} should run your {lib_fn.__name__} Function (found {[fn.__name__ for fn in fns]}).",
                hint=f"call {lib_fn.__name__}.apply(...), your class from the exercise above, not the library's.")
        tts = [_t(v, True) for v, _ in leaves]
        tout = tmake(*tts)
        assert_equal(out.shape, tuple(tout.shape), what=f"the shape of {what}", hint=hint)
        assert_close(out.numpy(), tout.detach().numpy(), what=what, rtol=1e-12, atol=1e-12, hint=hint)
        g = random_array(tuple(tout.shape))
        tout.backward(_t(g))
        out.backward(ct.Tensor(g))
        for i, (t, tt) in enumerate(zip(ts, tts)):
            require(t.grad is not None, f"{what}: no gradient reached input {i}.")
            assert_close(t.grad.numpy(), tt.grad.numpy(), what=f"the gradient of input {i} of {what}",
                         rtol=1e-9, atol=1e-12)

    x, y, z = random_array((r, c)), random_array((c,)), random_array((k, r, c))
    compare(f"a * b for a {x.shape} (transposed) and b {y.shape}", lambda a, b: a * b, lambda a, b: a * b,
            [(x, True), (y, False)], F.Mul)
    compare("2.5 * a", lambda a: 2.5 * a, lambda a: 2.5 * a, [(x, False)], F.Mul,
            hint="2.5 * a calls a.__rmul__(2.5): lift the number to a tensor, then multiply.")
    compare("a * -1.5", lambda a: a * -1.5, lambda a: a * -1.5, [(x, True)], F.Mul,
            hint="a Python number must become a 0-d tensor before it meets a Function.")
    compare(f"a.sum() for a {z.shape}", lambda a: a.sum(), lambda a: a.sum(), [(z, True)], F.Sum,
            hint="dim=None sums over every dim, one at a time; the result is 0-d (shape ()).")
    compare(f"a.sum(-1) for a {z.shape}", lambda a: a.sum(-1), lambda a: a.sum(-1), [(z, True)], F.Sum,
            hint="a negative dim counts from the end (dim % ndim); without keepdim the summed dim disappears.")
    compare(f"a.sum(1, keepdim=True) for a {z.shape}", lambda a: a.sum(1, keepdim=True),
            lambda a: a.sum(1, keepdim=True), [(z, False)], F.Sum,
            hint="with keepdim=True the summed dim stays, with size 1.")
    compare(f"a.sum(0) for a {x.shape}", lambda a: a.sum(0), lambda a: a.sum(0), [(x, True)], F.Sum,
            hint="without keepdim, reshape the summed dim (size 1 now) away.")

    def loss(v):
        return float(your_Tensor.sum(mine(v, True) * your_Tensor(y)).item())

    def grad(v):
        t = mine(v, True)
        your_Tensor.sum(t * your_Tensor(y)).backward()
        return t.grad.numpy()

    _gradient_check(loss, grad, x, "d/da of (a * b).sum()")
    return "*, reversed *, sum over all dims / one dim / keepdim, on transposed views, and a gradient check"


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



def _try(f):
    """A known mistake's output, or None when that mistake cannot even run on these shapes."""
    try:
        return f()
    except Exception:
        return None


@exercise
def matmul_backward(your_matmul_backward):
    """Gradients of a @ b for 2-D and batched 3-D inputs, vs torch."""
    n = int(rng().integers(3, 7))
    shapes = [((n, n), (n, n)), ((3, 5), (5, 4)), ((2, 3, 5), (2, 5, 4))]
    for sa, sb in shapes:
        a, b = random_array(sa), random_array(sb)
        ta, tb = _t(a, True), _t(b, True)
        out = ta @ tb
        g = random_array(tuple(out.shape))
        out.backward(_t(g))
        got = your_matmul_backward(a, b, g)
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



# ------------------------------------------------------------------ softmax and cross-entropy

@exercise
def softmax_cross_entropy(your_log_softmax, your_cross_entropy):
    """Stable log_softmax over the last axis and mean cross-entropy, vs torch, with huge logits."""
    for scale in (1.0, 30.0, 1000.0, "rows apart"):
        batch, classes = int(rng().integers(3, 9)), int(rng().integers(3, 11))
        if scale == "rows apart":  # fixed: rows 1500 apart, so only each row's OWN max keeps exp finite
            x = random_array((3, classes)) + np.array([[0.0], [-1500.0], [800.0]])
            batch = 3
        else:
            x = random_array((batch, classes)) * scale
        target = rng().integers(0, classes, batch)
        tx = _t(x)
        expected = torch.log_softmax(tx, -1).numpy()
        with np.errstate(all="ignore"):
            naive = np.log(np.exp(x) / np.exp(x).sum(-1, keepdims=True))
            wrong_axis = x - np.log(np.exp(x - x.max()).sum(0, keepdims=True)) - x.max()
            yours = your_log_softmax(x)
        finite = yours is not None and np.isfinite(np.asarray(yours, dtype=np.float64)).all()
        require(yours is None or finite,
                f"your log_softmax gave inf or nan on logits up to {np.abs(x).max():.0f}"
                + (" whose rows lie 1500 apart: exp underflows to 0 in the rows far below the batch's max."
                   if scale == "rows apart" else ": it is unstable, exp overflows for large logits."),
                hint="shift each row by its OWN max, not by the max of the whole batch.")
        assert_close(yours, expected, what=f"log_softmax of logits with scale {scale}", rtol=1e-9, atol=1e-9,
                     mistakes={"unstable: exp overflows for large logits. Subtract the row max first": naive,
                               "normalise over the last axis (axis=-1, keepdims=True), one row per example":
                               wrong_axis},
                     hint="log_softmax(x) = x - m - log(sum(exp(x - m))) with m the row max.")
        with np.errstate(all="ignore"):
            ce = your_cross_entropy(x, target)
        exp_ce = torch.nn.functional.cross_entropy(tx, torch.tensor(target)).item()
        assert_close(ce, exp_ce, what=f"cross_entropy with scale {scale}", rtol=1e-9,
                     mistakes={"take the MEAN over the batch, not the sum": exp_ce * batch,
                               "cross-entropy is MINUS the log-probability of the target": -exp_ce},
                     hint="cross-entropy is the average over the rows of minus the log-probability of each row's own target.")
    return "3 batches, logits up to 1000, and rows 1500 apart"


# ------------------------------------------------------------------ Linear module

@exercise
def linear(your_Linear):
    """A Linear(in, out) module: weight (out, in), bias (out,), y = x @ W^T + b; values and grads vs torch.
    The initial weights and bias must look like draws from uniform(-1/sqrt(in), 1/sqrt(in))."""
    import course_lib.tensor as ct

    in_f, out_f = int(rng().integers(48, 80)), int(rng().integers(40, 60))
    ct.manual_seed(int(rng().integers(0, 1000)))
    layer = your_Linear(in_f, out_f)
    bound = 1 / np.sqrt(in_f)
    for name, p, n in (("weight", getattr(layer, "weight", None), out_f * in_f), ("bias", getattr(layer, "bias", None), out_f)):
        require(p is not None and hasattr(p, "numpy"), f"Linear({in_f}, {out_f}) has no {name} Parameter.",
                hint="a Module finds its parameters through its attributes, each a Parameter.")
        v = p.numpy().ravel()
        require(v.size == n, f"Linear({in_f}, {out_f}).{name} should have {n} elements, it has {v.size}.")
        what = f"the initial {name} of Linear({in_f}, {out_f})"
        require(np.any(v != 0), f"{what} is all zeros; PyTorch draws it uniform in [-1/sqrt(in), 1/sqrt(in)] "
                f"= ±{bound:.4f}, like the weight.", hint="initialise the bias too, from the same uniform distribution.")
        require(np.abs(v).max() <= bound + 1e-6,
                f"{what} ranges over [{v.min():.4f}, {v.max():.4f}], outside ±1/sqrt(in) = ±{bound:.4f}.",
                hint="the bound is 1/sqrt(in_features), the number of inputs, for the weight and the bias alike.")
        negative = float(np.mean(v < 0))
        require(0.25 <= negative <= 0.75,
                f"{what}: {negative:.0%} of the values are negative; a uniform draw in ±{bound:.4f} has about half.",
                hint="draw from [-bound, bound], not from [0, bound).")
        if name == "weight":
            spread = float(v.std())
            require(abs(spread - bound / np.sqrt(3)) < 0.1 * bound / np.sqrt(3),
                    f"{what} has standard deviation {spread:.4f}; uniform(-{bound:.4f}, {bound:.4f}) has "
                    f"{bound / np.sqrt(3):.4f}.", hint="the initial values are uniform on [-bound, bound], as in torch.")
        else:
            require(np.abs(v).max() > bound / 2,
                    f"{what} stays within ±{np.abs(v).max():.4f}, far inside ±1/sqrt(in) = ±{bound:.4f}.",
                    hint="the bias has the same bound as the weight, 1/sqrt(in_features).")

    for in_f, out_f, lead in ((5, 3, (4,)), (7, 6, (2, 3))):
        ct.manual_seed(int(rng().integers(0, 1000)))
        layer = your_Linear(in_f, out_f)
        params = dict(layer.named_parameters())
        require(set(params) == {"weight", "bias"},
                f"Linear should have parameters 'weight' and 'bias' (as nn.Parameter), found {sorted(params)}.",
                hint="a Module finds its parameters through its attributes, each a Parameter.")
        assert_equal(layer.weight.shape, (out_f, in_f), what="weight.shape",
                     hint="torch's layout: weight is (out_features, in_features).")
        assert_equal(layer.bias.shape, (out_f,), what="bias.shape")
        bound = 1 / np.sqrt(in_f)
        w = layer.weight.numpy()
        require(np.abs(w).max() <= bound + 1e-6 and np.abs(w).max() > bound / 4 and w.std() > 0,
                f"weights should start uniform in [-1/sqrt(in), 1/sqrt(in)] = ±{bound:.3f}; "
                f"yours range over [{w.min():.3f}, {w.max():.3f}].",
                hint="draw them from the course's generator, so that ct.manual_seed fixes them.")
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
    return "the initial values of a large layer, then 2 random layers, values and gradients"


# ------------------------------------------------------------------ optimizer steps

@exercise
def optimizer_steps(your_sgd_momentum_step, your_adam_step):
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
        got = your_sgd_momentum_step(p, g, v, lr, mom)
        require(isinstance(got, tuple) and len(got) == 2, f"sgd_momentum_step returns (p, v), got {fmt(got)}")
        no_mom = p - lr * g
        p, v = got
        assert_close(p, tp.detach().numpy(), what=f"the parameter after SGD-momentum step {t}", rtol=1e-9,
                     mistakes={"the step used the gradient, not the velocity that accumulates it": no_mom})
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, 0.01
    tp = _t(p0, True)
    topt = torch.optim.Adam([tp], lr=lr, betas=(b1, b2), eps=eps)
    p, m, v = p0.copy(), np.zeros(shape), np.zeros(shape)
    for t, g in enumerate(grads, 1):
        tp.grad = _t(g)
        topt.step()
        m_exp, v_exp = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        uncorrected = p - lr * m_exp / (np.sqrt(v_exp) + eps)
        got = your_adam_step(p, g, m, v, t, lr, b1, b2, eps)
        require(isinstance(got, tuple) and len(got) == 3, f"adam_step returns (p, m, v), got {fmt(got)}")
        p, m, v = got
        assert_close(p, tp.detach().numpy(), what=f"the parameter after Adam step {t}", rtol=1e-9,
                     mistakes={"Adam without its bias correction: the running means start at zero and are too "
                               "small early on": uncorrected})
    return "5 steps of each on a random parameter"
