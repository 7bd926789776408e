"""Checks for chapter 08, custom operators: autograd.Function, custom_op, im2col and conv2d with its backward.

The oracle is PyTorch in float64: F.unfold, F.conv2d and its autograd gradients.
"""

import itertools

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from course_lib.checks import CheckFailed, assert_close, exercise, require, rng

_names = itertools.count()

WRONG_ORDER = ("are the gradients in the wrong order? backward must return one gradient per input of forward, "
               "in the order of forward's arguments: (dx, db) here, not (db, dx)")


def _t(shape, grad=False):
    return torch.tensor(rng().uniform(-2, 2, size=shape), dtype=torch.float64, requires_grad=grad)


FIXED_CASE = ((2, 3, 9, 8), (2, 3, 2, 3), dict(stride=2, padding=1, dilation=2))
"""Drawn on every run besides the random ones: dilation and stride above 1 with a 2x3 kernel on a
9x8 input, so a rule applied along one axis only, or rows and columns swapped, always shows."""


def _conv_case(rich=False):
    """A random conv configuration whose output is at least 1x1.

    rich: at least 2 samples and 2 channels, and overlapping windows (stride 1, a kernel of 2 or more),
    and some padding, so that mistakes which only show on such cases cannot slip through."""
    while True:
        N, C, O = (int(v) for v in rng().integers(2 if rich else 1, 4, size=3))
        H, W = (int(v) for v in rng().integers(5, 11, size=2))
        kh, kw = (int(v) for v in rng().integers(1, 4, size=2))
        stride, padding, dilation = int(rng().integers(1, 4)), int(rng().integers(0, 3)), int(rng().integers(1, 3))
        if rich:
            stride, kh, padding = 1, max(kh, 2), max(padding, 1)
        oh = (H + 2 * padding - dilation * (kh - 1) - 1) // stride + 1
        ow = (W + 2 * padding - dilation * (kw - 1) - 1) // stride + 1
        if oh >= 1 and ow >= 1 and padding <= min(H, W) - 1:
            return (N, C, H, W), (O, C, kh, kw), dict(stride=stride, padding=padding, dilation=dilation)


def _grads(out, inputs, dy):
    """Gradients of sum(out * dy) with respect to inputs, turning autograd's complaints into hints."""
    try:
        return torch.autograd.grad(out, inputs, dy, allow_unused=True)
    except RuntimeError as e:
        if "shape" in str(e) or "size" in str(e):
            raise CheckFailed(f"autograd rejected the gradients your backward returned: {e}") from None
        raise


def _bias_relu_case():
    extra = rng().integers(1, 7, size=int(rng().integers(0, 3)))
    shape = (int(rng().integers(2, 5)), int(rng().integers(2, 6))) + tuple(int(v) for v in extra)
    x, b = _t(shape, True), _t(shape[1], True)
    bview = b.view(-1, *([1] * (len(shape) - 2)))
    return x, b, bview


def _check_bias_relu_grads(out, x, b, bview, what):
    ref = torch.relu(x + bview)
    assert_close(out, ref, what=f"{what}'s output for x of shape {tuple(x.shape)}",
                 mistakes={"that is relu(x) + b: add the bias before the ReLU": torch.relu(x) + bview,
                           "the bias was added along the wrong dimension; it belongs to dimension 1 (channels)":
                           torch.relu(x + b.view(*([1] * (x.dim() - 1)), -1)) if x.shape[-1] == b.shape[0] else ref + 1e3})
    dy = _t(out.shape)
    try:
        dx, db = _grads(out, (x, b), dy)
    except CheckFailed as e:
        raise CheckFailed(f"{e}\n  hint: {WRONG_ORDER}; and db has b's shape (sum over every dimension but 1)") from None
    rx, rb = torch.autograd.grad(ref, (x, b), dy)
    require(dx is not None and db is not None, f"{what}: the gradient of x or of b is missing (backward returned None).")
    mask_x = (x > 0).double()
    assert_close(dx, rx, what=f"{what}'s gradient for x",
                 mistakes={"the ReLU mask must test x + b > 0 (the saved output), not x > 0": dy * mask_x})
    assert_close(db, rb, what=f"{what}'s gradient for b",
                 mistakes={"db must be summed over the batch too: every dimension but 1":
                           (dy * (ref > 0))[0].reshape(b.shape[0], -1).sum(1)})


@exercise
def bias_relu(your_BiasReLU):
    """A torch.autograd.Function computing relu(x + b) with its own backward."""
    require(isinstance(your_BiasReLU, type) and issubclass(your_BiasReLU, torch.autograd.Function),
            f"expected a subclass of torch.autograd.Function, got {your_BiasReLU!r}.")
    for _ in range(3):
        x, b, bview = _bias_relu_case()
        _check_bias_relu_grads(your_BiasReLU.apply(x, b), x, b, bview, "BiasReLU")
    x, b, _ = _bias_relu_case()
    require(torch.autograd.gradcheck(your_BiasReLU.apply, (x, b), raise_exception=False),
            "torch.autograd.gradcheck disagrees with your backward in float64.")
    return "3 random shapes and gradcheck in float64"


@exercise
def custom_op(your_register_bias_relu):
    """register_bias_relu(name) registers relu(x + b) with torch.library.custom_op and returns the op."""
    name = f"course_check{next(_names)}_{int(rng().integers(1 << 30))}::bias_relu"
    op = your_register_bias_relu(name)
    require(isinstance(op, torch._library.custom_ops.CustomOpDef),
            f"register_bias_relu should return what @torch.library.custom_op made, got {op!r}.",
            hint="the function register_bias_relu returns must be the op that torch.library.custom_op makes.")
    for _ in range(2):
        x, b, bview = _bias_relu_case()
        _check_bias_relu_grads(op(x, b), x, b, bview, "your op")
    x, b, _ = _bias_relu_case()
    try:
        torch.library.opcheck(op, (x, b))
    except Exception as e:
        msg = str(e).split("\n")[0][:400]
        raise CheckFailed(f"torch.library.opcheck failed: {msg}\n  hint: did you register a fake "
                          "implementation (op.register_fake) and the autograd formula (op.register_autograd)?") from None
    return "2 random shapes and torch.library.opcheck"


# PyTorch's functions that compute what an exercise asks, by the name TorchFunctionMode sees: the oracles.
ORACLES = {"unfold": "F.unfold", "fold": "F.fold", "conv2d": "F.conv2d", "conv_transpose2d": "F.conv_transpose2d",
           "convolution": "torch.convolution", "convolution_backward": "torch.nn.grad's conv2d gradients",
           "grad": "torch.autograd.grad", "backward": "autograd's backward"}


class _TorchCalls(TorchFunctionMode):
    """Notes the name of every torch function called while it is active (tensors' methods included)."""

    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", ""))
        return func(*args, **(kwargs or {}))


def _by_hand(call, name, allowed=()):
    """call()'s result, refused if it called one of PyTorch's ORACLES (other than `allowed`): the values
    would match because they are the check's own."""
    with _TorchCalls() as calls:
        result = call()
    used = [ORACLES[n] for n in ORACLES if n in calls.names and n not in allowed]
    if used:
        raise CheckFailed(f"your {name} calls {', '.join(used)}, which computes the answer for you: the check's "
                          f"oracle, so its values match whatever the exercise teaches.\n  hint: the exercise is "
                          f"to compute it from indexing, padding and matmul (lesson 08, sections 7 and 8: a window as "
                          f"a column, and the backward derived from it); PyTorch's is the check's, for comparing.")
    return result


def _unfold_hint(yours, x, kh, kw, c):
    """Name the mistake when the shape of im2col's result gives it away."""
    yours = yours.reshape(yours.shape[0], -1, yours.shape[-2] * yours.shape[-1]) if yours.dim() == 4 else yours
    for dp, hint in [(1, "padding off by one: pad p zeros on each side (your output is too big)"),
                     (-1, "padding off by one: pad p zeros on each side (your output is too small)")]:
        if c["padding"] + dp >= 0:
            p = dict(c, padding=c["padding"] + dp)
            try:
                if yours.shape[-1] == F.unfold(x, (kh, kw), **p).shape[-1]:
                    return hint
            except RuntimeError:
                pass
    return "the output size along one axis is (n + 2*padding - dilation*(k - 1) - 1) // stride + 1"


@exercise
def im2col(your_im2col):
    """im2col(x, kh, kw, stride, padding, dilation) -> (N, C*kh*kw, OH*OW), the layout of F.unfold."""
    for i in range(5):
        xs, ws, c = _conv_case(rich=i == 0) if i < 4 else FIXED_CASE
        x = _t(xs)
        kh, kw = ws[2:]
        yours = _by_hand(lambda: your_im2col(x, kh, kw, **c), "im2col")
        expected = F.unfold(x, (kh, kw), **c)
        if hasattr(yours, "shape") and tuple(yours.shape) != tuple(expected.shape):
            raise CheckFailed(f"im2col's result has the wrong shape: yours {tuple(yours.shape)}, expected "
                              f"{tuple(expected.shape)} for x of shape {xs}, kernel {kh}x{kw}, {c}.\n"
                              f"  hint: {_unfold_hint(yours, x, kh, kw, c)}")
        flipped = F.unfold(x.flip(2, 3), (kh, kw), **c) if c["padding"] == 0 and c["stride"] == 1 else None
        assert_close(yours, expected, what=f"im2col for x of shape {xs}, kernel {kh}x{kw}, {c}",
                     mistakes={"the rows of a column go channel first, then kernel row, then kernel column: "
                               "reshape (N, C, kh, kw, OH, OW) to (N, C*kh*kw, OH*OW)":
                               expected.reshape(xs[0], xs[1], kh * kw, -1).transpose(1, 2).reshape(expected.shape),
                               **({"you flipped the input: a window is read forwards": flipped} if flipped is not None else {})})
    return "4 random shapes with stride, padding and dilation"


def _conv_mistakes(x, w, b, c):
    m = {f"padding off by one: pad {c['padding']} zeros on each side": F.conv2d(x, w, b, **dict(c, padding=c["padding"] + 1))}
    if c["padding"] > 0:
        m[f"padding off by one: pad {c['padding']} zeros on each side "] = F.conv2d(x, w, b, **dict(c, padding=c["padding"] - 1))
    m |= {"your kernel is flipped: that is a true convolution; deep learning's conv2d is a cross-correlation "
         "(no flip)": F.conv2d(x, w.flip(2, 3), b, **c),
         "the bias is missing": F.conv2d(x, w, None, **c)}
    return m


@exercise
def conv2d_forward(your_conv2d_forward):
    """conv2d_forward(x, w, b, stride, padding, dilation) through im2col and one matmul, against F.conv2d."""
    for i in range(5):
        xs, ws, c = _conv_case(rich=i == 0) if i < 4 else FIXED_CASE
        x, w, b = _t(xs), _t(ws), _t(ws[0])
        yours = _by_hand(lambda: your_conv2d_forward(x, w, b, **c), "conv2d_forward", allowed=("unfold",))
        expected = F.conv2d(x, w, b, **c)
        if hasattr(yours, "shape") and tuple(yours.shape) != tuple(expected.shape):
            raise CheckFailed(f"conv2d's output has the wrong shape: yours {tuple(yours.shape)}, expected "
                              f"{tuple(expected.shape)} for x {xs}, w {ws}, {c}.\n"
                              f"  hint: {_unfold_hint(yours, x, *ws[2:], c)}")
        assert_close(yours, expected, what=f"conv2d for x {xs}, w {ws}, {c}", mistakes=_conv_mistakes(x, w, b, c))
    return "4 random shapes with stride, padding and dilation"


def _conv_grads(xs, ws, c):
    x, w, b = _t(xs, True), _t(ws, True), _t(ws[0], True)
    y = F.conv2d(x, w, b, **c)
    dy = _t(y.shape)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    return x.detach(), w.detach(), dy, dx, dw


@exercise
def conv2d_weight_grad(your_conv2d_weight_grad):
    """conv2d_weight_grad(x, dy, w_shape, stride, padding, dilation) = dL/dw, against autograd of F.conv2d."""
    for i in range(4):
        xs, ws, c = _conv_case(rich=i == 0)
        x, w, dy, _, dw = _conv_grads(xs, ws, c)
        yours = _by_hand(lambda: your_conv2d_weight_grad(x, dy, ws, **c), "conv2d_weight_grad", allowed=("unfold",))
        wr = w.clone().requires_grad_(True)
        dw_first = torch.autograd.grad(F.conv2d(x[:1], wr, None, **c), wr, dy[:1])[0]
        wf = w.clone().requires_grad_(True)
        dw_flip = torch.autograd.grad(F.conv2d(x, wf.flip(2, 3), None, **c), wf, dy)[0].flip(2, 3)
        mistakes = {"the kernel is flipped (true convolution); conv2d is a cross-correlation": dw_flip,
                    "that is the mean over the batch; the weight gradient is the SUM over the batch": dw / xs[0]}
        if xs[0] > 1:
            mistakes["that is the first sample's gradient only: every sample used the same weights"] = dw_first
        assert_close(yours, dw, what=f"dL/dw for x {xs}, w {ws}, {c}", mistakes=mistakes)
    xs, ws, c = _conv_case(rich=True)
    x, w, dy, _, _ = _conv_grads(xs, ws, c)
    yours, wv = your_conv2d_weight_grad(x, dy, ws, **c), w.clone()
    _gradient_check(yours, lambda: (F.conv2d(x, wv, None, **c) * dy).sum(), wv, f"dL/dw for x {xs}, w {ws}, {c}", h=1e-4)
    return "4 random shapes with stride, padding and dilation, and chapter 00's gradient check"


@exercise
def conv2d_input_grad(your_conv2d_input_grad):
    """conv2d_input_grad(dy, w, x_shape, stride, padding, dilation) = dL/dx, against autograd of F.conv2d."""
    for i in range(4):
        xs, ws, c = _conv_case(rich=i == 0)
        x, w, dy, dx, _ = _conv_grads(xs, ws, c)
        yours = _by_hand(lambda: your_conv2d_input_grad(dy, w, xs, **c), "conv2d_input_grad", allowed=("unfold",))
        if hasattr(yours, "shape") and tuple(yours.shape) != tuple(xs):
            p = c["padding"]
            hint = ("crop the padding off: return the [p:p+H, p:p+W] part of the padded gradient"
                    if tuple(yours.shape) == (xs[0], xs[1], xs[2] + 2 * p, xs[3] + 2 * p) else
                    "dL/dx has the shape of x")
            raise CheckFailed(f"dL/dx has the wrong shape: yours {tuple(yours.shape)}, expected {xs} for w {ws}, {c}.\n"
                              f"  hint: {hint}")
        xr = x.clone().requires_grad_(True)
        dx_flip = torch.autograd.grad(F.conv2d(xr, w.flip(2, 3), None, **c), xr, dy)[0]
        assert_close(yours, dx, what=f"dL/dx for x {xs}, w {ws}, {c}",
                     mistakes={"the kernel is flipped: the forward is a cross-correlation, so the backward reads the "
                               "kernel as it is, and col2im puts each entry back where im2col took it": dx_flip})
    xs, ws, c = _conv_case(rich=True)
    x, w, dy, _, _ = _conv_grads(xs, ws, c)
    yours, xv = your_conv2d_input_grad(dy, w, xs, **c), x.clone()
    _gradient_check(yours, lambda: (F.conv2d(xv, w, None, **c) * dy).sum(), xv, f"dL/dx for x {xs}, w {ws}, {c}", h=1e-4)
    return "4 random shapes with stride, padding and dilation, and chapter 00's gradient check"


# ---- chapter 00's gradient check, as an extra oracle for the backward passes -----------------

def _numerical_grad(loss, t, h=1e-6):
    """Central differences of the scalar loss() with respect to every element of t (changed in place, restored)."""
    grad = torch.zeros_like(t)
    flat, g = t.view(-1), grad.view(-1)
    for i in range(flat.numel()):
        old = flat[i].item()
        flat[i] = old + h
        up = float(loss())
        flat[i] = old - h
        down = float(loss())
        flat[i] = old
        g[i] = (up - down) / (2 * h)
    return grad


def _gradient_check(yours, loss, t, what, tol=1e-6, h=1e-6):
    """Chapter 00's gradient check: the worst relative error between your gradient and central differences."""
    from course_lib.gradcheck import relative_error

    with torch.no_grad():
        err = relative_error(_as_numpy(yours), _as_numpy(_numerical_grad(loss, t, h)))
    require(err < tol, f"chapter 00's gradient check: the relative error of {what} against central differences "
                       f"is {err:.2e} (a correct gradient gives below {tol:.0e}).")
    return err


def _as_numpy(t):
    return t.detach().cpu().double().numpy() if hasattr(t, "detach") else t


# ---- a conv2d kernel in Numba ---------------------------------------------------------------

def _numba_case(i):
    """x, w shapes, stride and padding; the first case has stride 2 and padding 1 or 2, so that
    ignoring either shows; sizes are drawn so that nothing is square or a multiple of anything."""
    while True:
        N, C, O = (int(v) for v in rng().integers(1, 4, size=3))
        H, W = (int(v) for v in rng().integers(5, 12, size=2))
        kh, kw = (int(v) for v in rng().integers(1, 5, size=2))
        stride, padding = int(rng().integers(1, 4)), int(rng().integers(0, 3))
        if i == 0:
            N, stride, padding, kh, kw, H = max(N, 2), 2, max(padding, 1), max(kh, 2), max(kw, 3), W + 1
        oh, ow = (H + 2 * padding - kh) // stride + 1, (W + 2 * padding - kw) // stride + 1
        if oh >= 2 and ow >= 2 and (i > 0 or kh != kw):
            return (N, C, H, W), (O, C, kh, kw), stride, padding


@exercise
def conv2d_numba(your_kernel):
    """kernel(x, w, b, out, stride, padding) fills out with conv2d, an @njit function on numpy arrays."""
    require(hasattr(your_kernel, "py_func") and hasattr(your_kernel, "signatures"),
            f"expected a Numba-compiled function, got {your_kernel!r}.",
            hint="the kernel must be compiled by Numba (@numba.njit).")
    for i in range(4):
        xs, ws, s, p = _numba_case(i)
        x, w, b = (rng().uniform(-2, 2, size=shape) for shape in (xs, ws, ws[:1]))
        xt, wt, bt = (torch.from_numpy(a) for a in (x, w, b))
        expected = F.conv2d(xt, wt, bt, stride=s, padding=p)
        garbage = rng().uniform(5, 9, size=expected.shape)
        out = garbage.copy()
        x0, w0 = x.copy(), w.copy()
        your_kernel(x, w, b, out, s, p)
        require((x == x0).all() and (w == w0).all(), "your kernel changed x or w; it should only write to out.")
        OH, OW = expected.shape[2:]
        pad_after = F.conv2d(F.pad(xt, (0, 2 * p, 0, 2 * p)), wt, bt, stride=s)[..., :OH, :OW]
        mistakes = {
            "your kernel is flipped: that is a true convolution; deep learning's conv2d is a cross-correlation, "
            "so tap (p, q) reads x[.., i*stride - padding + p, j*stride - padding + q]":
                F.conv2d(xt, wt.flip(2, 3), bt, stride=s, padding=p),
            "the stride is ignored: output (i, j) starts reading at row i*stride - padding and column j*stride - padding":
            F.conv2d(xt, wt, bt, stride=1, padding=p)[..., :OH, :OW],
            "the padding sits on one side only: window (i, j) starts at i*stride - padding, not at i*stride "
            "(the zeros of the padding come before the image as well as after it)": pad_after,
            "the bias is missing: every output of channel o starts from b[o]": F.conv2d(xt, wt, None, stride=s, padding=p),
            "out arrives holding garbage (like np.empty): set every element, do not only add to it":
            expected.numpy() + garbage,
        }
        assert_close(out, expected, what=f"conv2d for x {xs}, w {ws}, stride {s}, padding {p}", mistakes=mistakes)
    return "4 random shapes with stride and padding"


# ---- a C++ bias + GELU with its backward ---------------------------------------------------

_GELU_K = (2 / torch.pi) ** 0.5


def _gelu_tanh_parts(u):
    t = torch.tanh(_GELU_K * (u + 0.044715 * u ** 3))
    return t, 0.5 * u * (1 + t)


@exercise
def bias_gelu_cpp(your_BiasGELU):
    """A torch.autograd.Function computing gelu_tanh(x + b) (b along dimension 1) with its own backward."""
    require(isinstance(your_BiasGELU, type) and issubclass(your_BiasGELU, torch.autograd.Function),
            f"expected a subclass of torch.autograd.Function, got {your_BiasGELU!r}.")
    for _ in range(3):
        x, b, bview = _bias_relu_case()
        u = x + bview
        out = your_BiasGELU.apply(x, b)
        ref = F.gelu(u, approximate="tanh")
        t, _ = _gelu_tanh_parts(u)
        assert_close(out, ref, what=f"BiasGELU's output for x of shape {tuple(x.shape)}",
                     mistakes={"that is the exact (erf) GELU; this exercise uses the tanh form "
                               "0.5*u*(1 + tanh(sqrt(2/pi)*(u + 0.044715*u^3)))": F.gelu(u),
                               "that is gelu(x) + b: add the bias before the GELU": F.gelu(x, approximate="tanh") + bview})
        dy = _t(out.shape)
        try:
            dx, db = _grads(out, (x, b), dy)
        except CheckFailed as e:
            raise CheckFailed(f"{e}\n  hint: {WRONG_ORDER}; and db has b's shape (sum over every dimension but 1)") from None
        require(dx is not None and db is not None, "BiasGELU: the gradient of x or of b is missing (backward returned None).")
        rx, rb = torch.autograd.grad(ref, (x, b), dy)
        no_tanh_prime = dy * 0.5 * (1 + t)
        assert_close(dx, rx, what=f"BiasGELU's gradient for x of shape {tuple(x.shape)}",
                     mistakes={"the derivative lacks a term: gelu is u times a function of u, and the product "
                               "rule has a part for each factor": no_tanh_prime,
                               "that is the derivative of the erf GELU; differentiate the tanh form":
                               torch.autograd.grad(F.gelu(u), x, dy, retain_graph=True)[0]})
        dims = [d for d in range(x.dim()) if d != 1]
        assert_close(db, rb, what="BiasGELU's gradient for b",
                     mistakes={"db must be summed over the batch too: every dimension but 1":
                               rx[0].reshape(b.shape[0], -1).sum(1),
                               "db is dy summed, without the GELU's derivative: sum dx, not dy": dy.sum(dim=dims)})
    x = _t((2, 3, 2), True)
    b = _t((3,), True)
    require(torch.autograd.gradcheck(your_BiasGELU.apply, (x, b), raise_exception=False),
            "torch.autograd.gradcheck disagrees with your backward in float64.")
    dy = _t((2, 3, 2))
    dx = torch.autograd.grad(your_BiasGELU.apply(x, b), x, dy)[0]
    xs = x.detach().clone()
    _gradient_check(dx, lambda: (your_BiasGELU.apply(xs, b.detach()) * dy).sum(), xs, "dL/dx", tol=1e-5, h=1e-5)
    return "3 random shapes, gradcheck and chapter 00's gradient check in float64"
