"""course_lib.custom_ops against torch.nn.functional in float64: conv2d and max pooling, forward and backward.

Every variant (loops, im2col, Numba, the custom_op) must give F.conv2d's output and gradients on
random shapes with stride, padding and dilation, each an int or an (h, w) pair as F.conv2d takes
them, and pass gradcheck; the custom ops pass opcheck and trace into torch.compile without a graph break.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.custom_ops import conv
from course_lib.custom_ops import functions as fn
from course_lib.custom_ops import library as lib

torch.set_num_threads(1)

CONVS = {"loops": conv.conv2d_loops, "im2col": fn.conv2d_im2col, "numba": fn.conv2d_numba, "custom_op": lib.conv2d}
POOLS = {"torch code": fn.max_pool2d, "numba": fn.max_pool2d_numba}


def int_or_pair(lo, hi):
    return st.integers(lo, hi) | st.tuples(st.integers(lo, hi), st.integers(lo, hi))


@st.composite
def conv_cases(draw):
    n, c, o = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 5))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    stride, padding, dilation = draw(int_or_pair(1, 3)), draw(int_or_pair(0, 2)), draw(int_or_pair(1, 2))
    dh, dw = conv._pair(dilation)
    h = draw(st.integers(dh * (kh - 1) + 1, 11))
    w = draw(st.integers(dw * (kw - 1) + 1, 11))
    seed = draw(st.integers(0, 2**16))
    return (n, c, h, w), (o, c, kh, kw), dict(stride=stride, padding=padding, dilation=dilation), seed


def tensors(seed, *shapes):
    g = np.random.default_rng(seed)
    return [torch.tensor(g.uniform(-2, 2, s), dtype=torch.float64, requires_grad=True) for s in shapes]


@pytest.mark.parametrize("name", CONVS)
@settings(max_examples=8, deadline=None)
@given(case=conv_cases())
def test_conv_matches_torch_forward_and_backward(name, case):
    xs, ws, c, seed = case
    x, w, b = tensors(seed, xs, ws, ws[:1])
    ref = F.conv2d(x, w, b, **c)
    y = CONVS[name](x, w, b, **c)
    torch.testing.assert_close(y, ref)
    dy = tensors(seed + 1, ref.shape)[0].detach()
    for mine, theirs in zip(torch.autograd.grad(y, (x, w, b), dy), torch.autograd.grad(ref, (x, w, b), dy)):
        torch.testing.assert_close(mine, theirs)


ASYMMETRIC = [dict(stride=(2, 1)), dict(padding=(1, 2)), dict(dilation=(2, 1)),
              dict(stride=(1, 3), padding=(2, 0), dilation=(1, 2)),        # every argument a pair
              dict(stride=(3, 2), padding=1, dilation=(1, 2))]             # ints and pairs mixed


@pytest.mark.parametrize("c", ASYMMETRIC, ids=str)
@pytest.mark.parametrize("name", CONVS)
def test_conv_asymmetric_stride_padding_dilation(name, c):
    """A different stride, padding or dilation along h and w: forward, dx, dw and db as F.conv2d's."""
    x, w, b = tensors(9, (3, 3, 11, 9), (5, 3, 3, 3), (5,))
    ref = F.conv2d(x, w, b, **c)
    y = CONVS[name](x, w, b, **c)
    torch.testing.assert_close(y, ref)
    dy = tensors(10, ref.shape)[0].detach()
    for mine, theirs in zip(torch.autograd.grad(y, (x, w, b), dy), torch.autograd.grad(ref, (x, w, b), dy)):
        torch.testing.assert_close(mine, theirs)


def test_pair_is_how_conv2d_reads_its_arguments():
    assert conv._pair(2) == (2, 2) and conv._pair((2, 1)) == (2, 1) and conv._pair([1, 3]) == (1, 3)
    with pytest.raises(ValueError):
        conv._pair((1, 2, 3))


@pytest.mark.parametrize("name", CONVS)
def test_conv_gradcheck(name):
    x, w, b = tensors(0, (2, 2, 5, 4), (2, 2, 3, 2), (2,))
    assert torch.autograd.gradcheck(lambda x, w, b: CONVS[name](x, w, b, 2, 1, 2), (x, w, b))


def test_im2col_is_unfold_and_col2im_its_adjoint():
    x, = tensors(1, (2, 3, 9, 7))
    cols = conv.im2col(x, 3, 2, stride=2, padding=1, dilation=2)
    torch.testing.assert_close(cols, F.unfold(x, (3, 2), dilation=2, padding=1, stride=2))
    c, = tensors(2, cols.shape)          # <im2col(x), c> == <x, col2im(c)>
    lhs = (cols * c).sum()
    rhs = (x * conv.col2im(c, x.shape, 3, 2, stride=2, padding=1, dilation=2)).sum()
    torch.testing.assert_close(lhs, rhs)


@pytest.mark.parametrize("name", POOLS)
@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 4), h=st.integers(5, 11), w=st.integers(5, 11),
       k=st.integers(2, 3), stride=st.integers(1, 3), padding=st.integers(0, 1), dilation=st.integers(1, 2),
       seed=st.integers(0, 2**16))
def test_max_pool_matches_torch(name, n, c, h, w, k, stride, padding, dilation, seed):
    x, = tensors(seed, (n, c, h, w))
    ref = F.max_pool2d(x, k, stride, padding, dilation)
    y = POOLS[name](x, k, stride, padding, dilation)
    torch.testing.assert_close(y, ref)
    dy = tensors(seed + 1, ref.shape)[0].detach()
    torch.testing.assert_close(torch.autograd.grad(y, x, dy)[0], torch.autograd.grad(ref, x, dy)[0])


@pytest.mark.parametrize("name", POOLS)
def test_max_pool_gradcheck(name):
    x, = tensors(3, (1, 2, 6, 5))
    assert torch.autograd.gradcheck(lambda x: POOLS[name](x, 3, 2, 1, 1), (x,))


@pytest.mark.parametrize("bias_relu", [fn.bias_relu, lib.bias_relu], ids=["Function", "custom_op"])
def test_bias_relu(bias_relu):
    x, b = tensors(4, (3, 4, 5, 2), (4,))
    ref = torch.relu(x + b.view(1, 4, 1, 1))
    torch.testing.assert_close(bias_relu(x, b), ref)
    assert torch.autograd.gradcheck(bias_relu, (x, b))


def test_numba_wrapper_shares_memory():
    x, = tensors(5, (2, 3))
    view = fn.as_numpy(x)
    view[0, 0] = 42.0
    assert x[0, 0].item() == 42.0          # a view, not a copy


def test_opcheck():
    x, w, b = tensors(6, (2, 2, 5, 4), (3, 2, 3, 2), (3,))
    torch.library.opcheck(lib.conv2d, (x, w, b, 2, 1, 2))
    torch.library.opcheck(lib.conv2d, (x, w, b, (2, 1), (1, 2), (2, 1)))
    torch.library.opcheck(lib.bias_relu, (x, tensors(7, (2,))[0]))


@pytest.mark.parametrize("conf", [(1, 1, 1), ((2, 1), (1, 2), (1, 2))], ids=["ints", "pairs"])
def test_custom_ops_trace_into_torch_compile_without_graph_breaks(conf):
    """aot_eager runs the fake impls and the registered autograd through the compiler's tracing
    (Dynamo + AOTAutograd) with fullgraph=True; the lesson shows the inductor backend too."""
    torch._dynamo.reset()
    x, w, b = tensors(8, (2, 3, 7, 6), (4, 3, 3, 3), (4,))
    net = lambda x, w, b: lib.bias_relu(lib.conv2d(x, w, torch.zeros_like(b), *conf), b).square().sum()
    compiled = torch.compile(net, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, w, b), net(x, w, b))
    for g, r in zip(torch.autograd.grad(compiled(x, w, b), (x, w, b)), torch.autograd.grad(net(x, w, b), (x, w, b))):
        torch.testing.assert_close(g, r)
