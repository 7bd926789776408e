"""The Numba CUDA bias+ReLU Function equals relu(x + b) forward and backward, and passes gradcheck.

Without a GPU the kernels run on Numba's CUDA simulator (about 130 µs per thread), so the inputs
stay at a few hundred elements. The GPU-only test checks that CUDA tensors reach the kernels
without a copy: the kernel views share the tensors' memory and no host transfer happens.
"""

import numpy as np
import pytest
import torch

from course_lib.custom_ops import numba_cuda as nc

torch.set_num_threads(1)


def inputs(seed, shape, device="cpu"):
    g = np.random.default_rng(seed)
    x = torch.tensor(g.uniform(-2, 2, shape), device=device).requires_grad_()
    b = torch.tensor(g.uniform(-2, 2, shape[1]), device=device).requires_grad_()
    dy = torch.tensor(g.uniform(-2, 2, shape), device=device)
    return x, b, dy


def reference(x, b):
    return torch.relu(x + b.view(1, -1, *([1] * (x.dim() - 2))))


def check_against_torch(x, b, dy):
    y, ref = nc.bias_relu_cuda(x, b), reference(x, b)
    torch.testing.assert_close(y, ref)
    mine, theirs = torch.autograd.grad(y, (x, b), dy), torch.autograd.grad(ref, (x, b), dy)
    for m, t in zip(mine, theirs):
        torch.testing.assert_close(m, t)
    return y


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_torch_on_random_odd_shapes(seed):
    shape = tuple(int(s) for s in np.random.default_rng(100 + seed).choice([1, 3, 5, 7], size=4))
    shape = (shape[0], shape[1] + 2, shape[2], shape[3])           # at least 3 channels
    assert np.prod(shape) < 2000                                     # the simulator's budget
    y = check_against_torch(*inputs(seed, shape))
    assert y.dtype == torch.float64 and y.shape == shape


def test_other_ranks_and_float32():
    x, b, dy = inputs(3, (5, 7))                                     # (N, C): one element per channel
    check_against_torch(x, b, dy)
    x, b, _ = inputs(4, (3, 5, 9))
    y = nc.bias_relu_cuda(x.detach().float(), b.detach().float())
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, reference(x, b).float())


def test_gradcheck_float64():
    x, b, _ = inputs(5, (2, 3, 5))
    assert torch.autograd.gradcheck(nc.bias_relu_cuda, (x, b))


@pytest.mark.gpu
def test_cuda_tensors_are_passed_without_copies(monkeypatch):
    from numba.cuda.cudadrv import devicearray

    x, b, dy = inputs(6, (4, 9, 13, 11), device="cuda")
    view = nc.kernel_view(x)
    assert view.device_ctypes_pointer.value == x.data_ptr()          # same device memory

    def no_transfer(*args, **kwargs):
        raise AssertionError("a host <-> device copy happened")

    monkeypatch.setattr(devicearray.DeviceNDArrayBase, "copy_to_host", no_transfer)
    monkeypatch.setattr(devicearray.DeviceNDArrayBase, "copy_to_device", no_transfer)
    y = check_against_torch(x, b, dy)
    assert y.is_cuda and y.device == x.device
