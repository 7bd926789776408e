"""A fused bias + ReLU written in C++ (and CUDA when a GPU and nvcc exist), built with load_inline.

`load_inline` writes the sources to the torch extensions folder (TORCH_EXTENSIONS_DIR, by
default ~/.cache/torch_extensions), compiles them with ninja and g++, and imports the result
as a Python module. A cold build takes about half a minute; later calls, in this process or
another, find the compiled module in that folder and load it at once.

    y = relu(x + b)      (b broadcast over the channel dimension 1)
    dx = dy * (y > 0),   db = dx summed over every dimension but 1
"""

import shutil

import torch

CPP_SOURCE = r"""
#include <torch/extension.h>

// y[i] = max(x[i] + b[c], 0), where c is the channel (dimension 1) of element i.
torch::Tensor bias_relu_forward(torch::Tensor x, torch::Tensor b) {
    TORCH_CHECK(x.device().is_cpu(), "bias_relu_forward: x must be on the CPU");
    TORCH_CHECK(x.dim() >= 2 && b.dim() == 1 && b.size(0) == x.size(1), "bias_relu_forward: b must have x.size(1) entries");
    auto xc = x.contiguous();
    auto bc = b.contiguous().to(x.scalar_type());
    auto y = torch::empty_like(xc);
    const int64_t C = xc.size(1);
    const int64_t inner = xc.numel() / (xc.size(0) * C);   // elements per (sample, channel)
    AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "bias_relu_forward", [&] {
        const scalar_t* xp = xc.data_ptr<scalar_t>();
        const scalar_t* bp = bc.data_ptr<scalar_t>();
        scalar_t* yp = y.data_ptr<scalar_t>();
        at::parallel_for(0, xc.numel(), 4096, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
                scalar_t v = xp[i] + bp[(i / inner) % C];
                yp[i] = v > 0 ? v : scalar_t(0);
            }
        });
    });
    return y;
}

// dx = dy where y > 0, else 0. The bias gradient is dx summed in Python (one line there).
torch::Tensor bias_relu_backward(torch::Tensor dy, torch::Tensor y) {
    auto dyc = dy.contiguous();
    auto yc = y.contiguous();
    auto dx = torch::empty_like(yc);
    AT_DISPATCH_FLOATING_TYPES(yc.scalar_type(), "bias_relu_backward", [&] {
        const scalar_t* g = dyc.data_ptr<scalar_t>();
        const scalar_t* yp = yc.data_ptr<scalar_t>();
        scalar_t* out = dx.data_ptr<scalar_t>();
        at::parallel_for(0, yc.numel(), 4096, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) out[i] = yp[i] > 0 ? g[i] : scalar_t(0);
        });
    });
    return dx;
}
"""

CUDA_SOURCE = r"""
#include <torch/extension.h>

template <typename scalar_t>
__global__ void bias_relu_kernel(const scalar_t* x, const scalar_t* b, scalar_t* y,
                                 int64_t n, int64_t C, int64_t inner) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) {
        scalar_t v = x[i] + b[(i / inner) % C];
        y[i] = v > 0 ? v : scalar_t(0);
    }
}

torch::Tensor bias_relu_forward_cuda(torch::Tensor x, torch::Tensor b) {
    auto xc = x.contiguous();
    auto bc = b.contiguous().to(x.scalar_type());
    auto y = torch::empty_like(xc);
    const int64_t n = xc.numel(), C = xc.size(1), inner = n / (xc.size(0) * C);
    const int threads = 256;
    const int blocks = (int)((n + threads - 1) / threads);
    AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "bias_relu_forward_cuda", [&] {
        bias_relu_kernel<scalar_t><<<blocks, threads>>>(xc.data_ptr<scalar_t>(), bc.data_ptr<scalar_t>(),
                                                        y.data_ptr<scalar_t>(), n, C, inner);
    });
    return y;
}
"""

_modules = {}


def build_cpu(verbose=False):
    """Compile (or load from the extensions folder) the C++ module; returns it."""
    if "cpu" not in _modules:
        from torch.utils.cpp_extension import load_inline

        _modules["cpu"] = load_inline(
            name="course_bias_relu_cpu", cpp_sources=[CPP_SOURCE],
            functions=["bias_relu_forward", "bias_relu_backward"],
            extra_cflags=["-O2"], verbose=verbose)
    return _modules["cpu"]


def cuda_available():
    """True only with a CUDA build of torch, a visible GPU and an nvcc to compile with."""
    from torch.utils.cpp_extension import CUDA_HOME

    return torch.cuda.is_available() and (CUDA_HOME is not None or shutil.which("nvcc") is not None)


def build_cuda(verbose=False):
    """Compile the .cu variant; only call this when `cuda_available()` is True."""
    if not cuda_available():
        raise RuntimeError("the CUDA variant needs a GPU, a CUDA build of torch and nvcc; none found here")
    if "cuda" not in _modules:
        from torch.utils.cpp_extension import load_inline

        _modules["cuda"] = load_inline(
            name="course_bias_relu_cuda",
            cpp_sources=["torch::Tensor bias_relu_forward_cuda(torch::Tensor x, torch::Tensor b);"],
            cuda_sources=[CUDA_SOURCE], functions=["bias_relu_forward_cuda"], verbose=verbose)
    return _modules["cuda"]


class BiasReLUCpp(torch.autograd.Function):
    """relu(x + b) with the C++ kernels in forward and backward."""

    @staticmethod
    def forward(ctx, x, b):
        y = build_cpu().bias_relu_forward(x, b)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dx = build_cpu().bias_relu_backward(dy, y)
        db = dx.sum(dim=[d for d in range(dx.dim()) if d != 1])
        return dx, db


def bias_relu_cpp(x, b):
    return BiasReLUCpp.apply(x, b)


_inline = {}


def build_inline(name, source, functions, verbose=False):
    """Compile C++ `source` into a module called `name` exposing `functions`, and return it.

    The first build of a source takes half a minute or more; the compiled module stays in the
    extensions folder, so a later call with the same name and the same source, in this process or
    another, loads it at once. Keep `name` fixed while you edit: a changed source rebuilds under it.
    """
    key = (name, source, tuple(functions))
    if key not in _inline:
        from torch.utils.cpp_extension import load_inline

        _inline[key] = load_inline(name=name, cpp_sources=[source], functions=list(functions),
                                   extra_cflags=["-O2"], verbose=verbose)
    return _inline[key]
