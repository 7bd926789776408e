"""The C++ op built with load_inline equals relu(x + b) forward and backward, and passes gradcheck.

The first build compiles for about 40 CPU seconds; it is cached in the torch extensions folder
(TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions), so later runs load it in a second.
"""

import shutil

import pytest
import torch

from course_lib.custom_ops import cpp

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("ninja") is None
                                and not __import__("importlib.util").util.find_spec("ninja"),
                                reason="building a C++ extension needs g++ and ninja")


def test_cpp_bias_relu_matches_torch_and_passes_gradcheck():
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(3, 5, 4, 2, generator=g, dtype=torch.float64) * 4 - 2).requires_grad_()
    b = (torch.rand(5, generator=g, dtype=torch.float64) * 4 - 2).requires_grad_()
    ref = torch.relu(x + b.view(1, 5, 1, 1))
    y = cpp.bias_relu_cpp(x, b)
    torch.testing.assert_close(y, ref)
    dy = torch.rand(ref.shape, generator=g, dtype=torch.float64)
    for mine, theirs in zip(torch.autograd.grad(y, (x, b), dy), torch.autograd.grad(ref, (x, b), dy)):
        torch.testing.assert_close(mine, theirs)
    assert torch.autograd.gradcheck(cpp.bias_relu_cpp, (x[:1, :, :2].detach().requires_grad_(), b))
    assert cpp.bias_relu_cpp(x.float(), b.float()).dtype == torch.float32


@pytest.mark.gpu
def test_cuda_variant_matches_cpu():
    if not cpp.cuda_available():
        pytest.skip("a GPU is present but this torch build or nvcc cannot compile CUDA")
    x, b = torch.randn(4, 6, 5, 5, device="cuda"), torch.randn(6, device="cuda")
    torch.testing.assert_close(cpp.build_cuda().bias_relu_forward_cuda(x, b), torch.relu(x + b.view(1, 6, 1, 1)))
