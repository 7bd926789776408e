"""Chapter 08's checks pass on the reference and reject plausible mistakes."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from checking import expect_failure
from edits import edited

from course_lib.checks import ch08 as check
from course_lib.custom_ops import conv


def dims(x):
    return [d for d in range(x.dim()) if d != 1]


def bview(b, x):
    return b.view(-1, *([1] * (x.dim() - 2)))


def make_bias_relu(forward=None, backward=None):
    class F_(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, b):
            y = forward(x, b) if forward else torch.relu(x + bview(b, x))
            ctx.save_for_backward(x, b, y)
            return y

        @staticmethod
        def backward(ctx, dy):
            x, b, y = ctx.saved_tensors
            if backward:
                return backward(dy, x, b, y)
            dx = dy * (y > 0)
            return dx, dx.sum(dim=dims(dx))
    return F_


def test_reference_passes(capsys):
    check.bias_relu(make_bias_relu())
    check.im2col(conv.im2col)
    check.conv2d_forward(conv.conv2d_im2col)
    check.conv2d_weight_grad(conv.conv2d_weight_grad)
    check.conv2d_input_grad(conv.conv2d_input_grad)
    assert capsys.readouterr().out.count("passed") == 5


@pytest.mark.parametrize("wrong, hint", [
    (make_bias_relu(backward=lambda dy, x, b, y: ((dy * (y > 0)).sum(dim=dims(dy)), dy * (y > 0))), "wrong order"),
    (make_bias_relu(backward=lambda dy, x, b, y: (dy * (x > 0), (dy * (x > 0)).sum(dim=dims(dy)))), "x + b > 0"),
    (make_bias_relu(backward=lambda dy, x, b, y: (dy * (y > 0), (dy * (y > 0))[0].reshape(b.shape[0], -1).sum(1))),
     "summed over the batch"),
    (make_bias_relu(forward=lambda x, b: torch.relu(x) + bview(b, x)), "before the ReLU"),
    (torch.nn.ReLU, "subclass of torch.autograd.Function"),
])
def test_bias_relu_rejects(wrong, hint):
    expect_failure(check.bias_relu, wrong, match=hint)


def register(fake=True, order_ok=True, impl=None):
    def reg(name):
        @torch.library.custom_op(name, mutates_args=())
        def op(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return impl(x, b) if impl else torch.relu(x + bview(b, x))

        if fake:
            op.register_fake(lambda x, b: torch.empty_like(x))

        def setup(ctx, inputs, output):
            ctx.save_for_backward(output)

        def backward(ctx, dy):
            (y,) = ctx.saved_tensors
            dx = dy * (y > 0)
            db = dx.sum(dim=dims(dx))
            return (dx, db) if order_ok else (db, dx)

        op.register_autograd(backward, setup_context=setup)
        return op
    return reg


def test_custom_op_reference_passes(capsys):
    check.custom_op(register())
    assert "passed" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, hint", [
    (register(order_ok=False), "wrong order"),
    (register(fake=False), "opcheck"),
    (register(impl=lambda x, b: torch.relu(x) + bview(b, x)), "before the ReLU"),
    (lambda name: (lambda x, b: torch.relu(x + bview(b, x))), "custom_op"),
])
def test_custom_op_rejects(wrong, hint):
    expect_failure(check.custom_op, wrong, match=hint)


def im2col_flipped(x, kh, kw, stride=1, padding=0, dilation=1):
    return conv.im2col(x.flip(2, 3), kh, kw, stride, padding, dilation)


def im2col_pad_plus_one(x, kh, kw, stride=1, padding=0, dilation=1):
    return conv.im2col(x, kh, kw, stride, padding + 1, dilation)


def im2col_offsets_first(x, kh, kw, stride=1, padding=0, dilation=1):
    cols = conv.im2col(x, kh, kw, stride, padding, dilation)
    N, K, L = cols.shape
    return cols.reshape(N, x.shape[1], kh * kw, L).transpose(1, 2).reshape(N, K, L)


def im2col_dilate_rows_only(x, kh, kw, stride=1, padding=0, dilation=1):
    return F.unfold(x, (kh, kw), dilation=(dilation, 1), padding=padding, stride=stride)


def im2col_stride_rows_only(x, kh, kw, stride=1, padding=0, dilation=1):
    return F.unfold(x, (kh, kw), dilation=dilation, padding=padding, stride=(stride, 1))


@pytest.mark.parametrize("wrong, hint", [(im2col_flipped, "differs"), (im2col_pad_plus_one, "padding off by one"),
                                         (im2col_offsets_first, "channel first"),
                                         (im2col_dilate_rows_only, None),   # a random case may catch it first
                                         (im2col_stride_rows_only, None)])
def test_im2col_rejects(wrong, hint):
    expect_failure(check.im2col, wrong, match=hint)


def conv_flipped(x, w, b, stride=1, padding=0, dilation=1):
    return conv.conv2d_im2col(x, w.flip(2, 3), b, stride, padding, dilation)


def conv_pad_minus_one(x, w, b, stride=1, padding=0, dilation=1):
    return conv.conv2d_im2col(x, w, b, stride, max(padding - 1, 0) if padding else padding + 1, dilation)


def conv_no_bias(x, w, b, stride=1, padding=0, dilation=1):
    return conv.conv2d_im2col(x, w, None, stride, padding, dilation)


@pytest.mark.parametrize("wrong, hint", [(conv_flipped, "flipped"), (conv_pad_minus_one, "padding off by one"),
                                         (conv_no_bias, "bias is missing")])
def test_conv2d_forward_rejects(wrong, hint):
    expect_failure(check.conv2d_forward, wrong, match=hint)


def wgrad_first_sample(x, dy, w_shape, stride=1, padding=0, dilation=1):
    return conv.conv2d_weight_grad(x[:1], dy[:1], w_shape, stride, padding, dilation)


def wgrad_mean(x, dy, w_shape, stride=1, padding=0, dilation=1):
    return conv.conv2d_weight_grad(x, dy, w_shape, stride, padding, dilation) / x.shape[0]


def wgrad_flipped(x, dy, w_shape, stride=1, padding=0, dilation=1):
    return conv.conv2d_weight_grad(x.flip(2, 3), dy.flip(2, 3), w_shape, stride, padding, dilation)


@pytest.mark.parametrize("wrong, hint", [(wgrad_first_sample, "first sample"), (wgrad_mean, "SUM over the batch"),
                                         (wgrad_flipped, "differs")])
def test_conv2d_weight_grad_rejects(wrong, hint):
    expect_failure(check.conv2d_weight_grad, wrong, match=hint)


def igrad_flipped(dy, w, x_shape, stride=1, padding=0, dilation=1):
    return conv.conv2d_input_grad(dy, w.flip(2, 3), x_shape, stride, padding, dilation)


def igrad_uncropped(dy, w, x_shape, stride=1, padding=0, dilation=1):
    N, C, H, W = x_shape
    O, _, kh, kw = w.shape
    dcols = w.reshape(O, -1).t() @ dy.reshape(N, O, -1)
    p = padding
    full = conv.col2im(dcols, (N, C, H + 2 * p, W + 2 * p), kh, kw, stride, 0, dilation)
    return full


def igrad_overwrites(dy, w, x_shape, stride=1, padding=0, dilation=1):
    """Assigns instead of adding where windows overlap."""
    N, C, H, W = x_shape
    O, _, kh, kw = w.shape
    OH, OW = dy.shape[2:]
    dcols = (w.reshape(O, -1).t() @ dy.reshape(N, O, -1)).reshape(N, C, kh, kw, OH, OW)
    dxp = dy.new_zeros(N, C, H + 2 * padding, W + 2 * padding)
    for a, c in itertools.product(range(kh), range(kw)):
        dxp[:, :, a * dilation: a * dilation + stride * (OH - 1) + 1: stride,
                  c * dilation: c * dilation + stride * (OW - 1) + 1: stride] = dcols[:, :, a, c]
    return dxp[:, :, padding: padding + H, padding: padding + W]


@pytest.mark.parametrize("wrong, hint", [(igrad_flipped, "differs"), (igrad_uncropped, "wrong shape"),
                                         (igrad_overwrites, "differs")])
def test_conv2d_input_grad_rejects(wrong, hint):
    expect_failure(check.conv2d_input_grad, wrong, match=hint)


def im2col_by_unfold(x, kh, kw, stride=1, padding=0, dilation=1):
    return torch.nn.Unfold((kh, kw), dilation=dilation, padding=padding, stride=stride)(x)


def conv_by_conv2d(x, w, b, stride=1, padding=0, dilation=1):
    return F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation)


def wgrad_by_autograd(x, dy, w_shape, stride=1, padding=0, dilation=1):
    w = torch.zeros(w_shape, dtype=x.dtype, requires_grad=True)
    return torch.autograd.grad(conv.conv2d_im2col(x, w, None, stride, padding, dilation), w, dy)[0]


def wgrad_by_torch_grad(x, dy, w_shape, stride=1, padding=0, dilation=1):
    return torch.nn.grad.conv2d_weight(x, w_shape, dy, stride=stride, padding=padding, dilation=dilation)


def igrad_by_fold(dy, w, x_shape, stride=1, padding=0, dilation=1):
    N, C, H, W = x_shape
    O, _, kh, kw = w.shape
    dcols = w.reshape(O, -1).t() @ dy.reshape(N, O, -1)
    return F.fold(dcols, (H, W), (kh, kw), dilation=dilation, padding=padding, stride=stride)


@pytest.mark.parametrize("exercise, wrong, oracle", [
    (check.im2col, im2col_by_unfold, "F.unfold"),
    (check.conv2d_forward, conv_by_conv2d, "F.conv2d"),
    (check.conv2d_weight_grad, wgrad_by_autograd, "torch.autograd.grad"),
    (check.conv2d_weight_grad, wgrad_by_torch_grad, "torch.nn.grad"),
    (check.conv2d_input_grad, igrad_by_fold, "F.fold"),
])
def test_an_answer_that_calls_the_oracle_is_refused(exercise, wrong, oracle):
    """Right values, because they are PyTorch's own: the exercise is to compute them."""
    expect_failure(exercise, wrong, match=oracle)


def conv_by_unfold(x, w, b, stride=1, padding=0, dilation=1):
    """Correct, written another way: F.unfold in place of the learner's im2col (the previous exercise)."""
    cols = F.unfold(x, w.shape[2:], dilation=dilation, padding=padding, stride=stride)
    N, H, W = x.shape[0], x.shape[2], x.shape[3]
    OH = (H + 2 * padding - dilation * (w.shape[2] - 1) - 1) // stride + 1
    OW = (W + 2 * padding - dilation * (w.shape[3] - 1) - 1) // stride + 1
    return (w.reshape(w.shape[0], -1) @ cols + b[:, None]).reshape(N, w.shape[0], OH, OW)


def test_conv2d_forward_may_use_unfold_for_its_columns(capsys):
    check.conv2d_forward(conv_by_unfold)
    assert "passed" in capsys.readouterr().out


def test_stub_is_reported_as_not_implemented():
    def stub(*args, **kwargs):
        raise NotImplementedError

    for c in (check.im2col, check.conv2d_forward, check.conv2d_weight_grad, check.conv2d_input_grad, check.custom_op):
        expect_failure(c, stub, match="not implemented yet")


# ---- the Numba conv2d kernel ---------------------------------------------------------------

import numba  # noqa: E402


@numba.njit(cache=True)
def conv_rows_reference(x, w, b, out, stride, padding):
    N, C, H, W = x.shape
    O, _, KH, KW = w.shape
    _, _, OH, OW = out.shape
    for n in range(N):
        for o in range(O):
            for i in range(OH):
                for j in range(OW):
                    acc = b[o]
                    for c in range(C):
                        for p in range(KH):
                            h = i * stride - padding + p
                            for q in range(KW):
                                v = j * stride - padding + q
                                if 0 <= h < H and 0 <= v < W:
                                    acc += w[o, c, p, q] * x[n, c, h, v]
                    out[n, o, i, j] = acc


# the wrong kernels: the reference with one mistake edited in (tests/edits.py)
# a true convolution: tap (p, q) uses the kernel's opposite entry
conv_rows_flipped = edited(conv_rows_reference, "conv_rows_flipped", ("w[o, c, p, q]", "w[o, c, KH - 1 - p, KW - 1 - q]"))
# forgets to shift the window by -padding: the zeros end up after the image only
conv_rows_pad_one_side = edited(conv_rows_reference, "conv_rows_pad_one_side",
                                ("i * stride - padding + p", "i * stride + p"), ("j * stride - padding + q", "j * stride + q"))
conv_rows_no_stride = edited(conv_rows_reference, "conv_rows_no_stride",
                             ("i * stride - padding + p", "i - padding + p"), ("j * stride - padding + q", "j - padding + q"))
# adds into out as if it started at zero
conv_rows_accumulates = edited(conv_rows_reference, "conv_rows_accumulates", ("acc = b[o]", "acc = out[n, o, i, j] + b[o]"))


def conv_rows_plain_python(x, w, b, out, stride, padding):
    out[:] = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), stride=stride, padding=padding).numpy()


def test_conv2d_numba_reference_passes(capsys):
    check.conv2d_numba(conv_rows_reference)
    assert "passed" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, hint", [(conv_rows_flipped, "flipped"), (conv_rows_pad_one_side, "one side only"),
                                         (conv_rows_no_stride, "stride is ignored"), (conv_rows_accumulates, "garbage"),
                                         (conv_rows_plain_python, "Numba-compiled")])
def test_conv2d_numba_rejects(wrong, hint):
    expect_failure(check.conv2d_numba, wrong, match=hint)


# ---- the C++ bias + GELU, through its autograd.Function ------------------------------------
# The check sees only the Function, so the wrong implementations are written with torch ops here
# (building a C++ extension per mistake would take minutes); the solution notebook runs the C++ one.

K = (2 / torch.pi) ** 0.5


def gelu_tanh(u):
    return 0.5 * u * (1 + torch.tanh(K * (u + 0.044715 * u ** 3)))


def gelu_tanh_grad(u, tanh_prime=True):
    t = torch.tanh(K * (u + 0.044715 * u ** 3))
    return 0.5 * (1 + t) + (0.5 * u * (1 - t * t) * K * (1 + 3 * 0.044715 * u * u) if tanh_prime else 0)


def make_bias_gelu(forward=gelu_tanh, grad=gelu_tanh_grad, db=lambda dx: dx.sum(dim=dims(dx))):
    class G(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, b):
            ctx.save_for_backward(x, b)
            return forward(x + bview(b, x))

        @staticmethod
        def backward(ctx, dy):
            x, b = ctx.saved_tensors
            dx = dy * grad(x + bview(b, x))
            return dx, db(dx)
    return G


def test_bias_gelu_reference_passes(capsys):
    check.bias_gelu_cpp(make_bias_gelu())
    assert "passed" in capsys.readouterr().out


def erf_grad(u):
    return 0.5 * (1 + torch.erf(u / 2 ** 0.5)) + u * torch.exp(-u * u / 2) / (2 * torch.pi) ** 0.5


@pytest.mark.parametrize("wrong, hint", [
    (make_bias_gelu(forward=F.gelu, grad=erf_grad), "erf"),
    (make_bias_gelu(db=lambda dx: dx[0].reshape(dx.shape[1], -1).sum(1)), "summed over the batch"),
    (make_bias_gelu(grad=lambda u: gelu_tanh_grad(u, tanh_prime=False)), "product rule"),
    (make_bias_gelu(forward=lambda u: gelu_tanh(u), grad=lambda u: gelu_tanh_grad(u) * 1.001), "differs"),
    (torch.nn.GELU, "subclass of torch.autograd.Function"),
])
def test_bias_gelu_rejects(wrong, hint):
    expect_failure(check.bias_gelu_cpp, wrong, match=hint)



@numba.njit
def numba_stub(x, w, b, out, stride, padding):
    raise NotImplementedError("Exercise: replace this line with your code")


class GeluStub(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, b):
        raise NotImplementedError("Exercise: replace this line with your code")


def test_new_stubs_are_reported_as_not_implemented():
    expect_failure(check.conv2d_numba, numba_stub, match="not implemented yet")
    expect_failure(check.bias_gelu_cpp, GeluStub, match="not implemented yet")
