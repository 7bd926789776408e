"""The fused bias + ReLU as Numba CUDA kernels inside a torch.autograd.Function.

    y = relu(x + b)      (b broadcast over the channel dimension 1)
    dx = dy where y > 0, else 0;   db = dx summed over every dimension but 1

The same op as `functions.BiasReLU`, one CUDA thread per element. How tensors reach the kernels:

- On a GPU, with CUDA tensors: `cuda.as_cuda_array(t.detach())` wraps the tensor's device memory
  through its `__cuda_array_interface__` (a pointer, a shape, a dtype), so nothing is copied.
  The output is allocated by torch and the kernel writes into it, on torch's current stream.
- On Numba's CUDA simulator (no GPU): torch has no CUDA tensors, so the kernels get the `.numpy()`
  views of CPU tensors. The simulator copies each array into its pretend device memory and back
  after the launch, so this path copies; it exists to run and test the same kernels anywhere.
  It is slow (about 130 µs per thread): keep tensors to a few thousand elements.
"""

from course_lib import device

device.setup(verbose=False)

import torch  # noqa: E402
from numba import cuda  # noqa: E402  (after the device is chosen)

THREADS = 128   # threads per block


@cuda.jit
def bias_relu_forward_kernel(x, b, y, inner):
    """y[i] = max(x[i] + b[c], 0) on flat arrays; c = (i // inner) % C, inner = elements per channel."""
    i = cuda.grid(1)
    if i < x.size:
        v = x[i] + b[(i // inner) % b.size]
        y[i] = v if v > 0 else 0


@cuda.jit
def bias_relu_backward_kernel(dy, y, dx):
    """dx[i] = dy[i] where the output was positive, else 0."""
    i = cuda.grid(1)
    if i < y.size:
        dx[i] = dy[i] if y[i] > 0 else 0


def kernel_view(t):
    """What a kernel gets for a contiguous tensor `t`: a zero-copy device view (CUDA) or a numpy view (CPU)."""
    t = t.detach()
    return cuda.as_cuda_array(t) if t.is_cuda else t.numpy()


def _launch(kernel, n, *args):
    """Run `kernel` over n elements; on a GPU, on torch's current stream so it is ordered with torch's work."""
    if n == 0:
        return
    blocks = (n + THREADS - 1) // THREADS
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    views = [kernel_view(a.view(-1)) if isinstance(a, torch.Tensor) else a for a in args]
    if tensors[0].is_cuda:
        stream = cuda.external_stream(torch.cuda.current_stream(tensors[0].device).cuda_stream)
        kernel[blocks, THREADS, stream](*views)
    else:
        kernel[blocks, THREADS](*views)


class BiasReLUCuda(torch.autograd.Function):
    """relu(x + b) with Numba CUDA kernels in forward and backward."""

    @staticmethod
    def forward(ctx, x, b):
        x, b = x.contiguous(), b.contiguous().to(x.dtype)
        y = torch.empty_like(x)
        inner = x.numel() // max(x.shape[0] * x.shape[1], 1)
        _launch(bias_relu_forward_kernel, x.numel(), x, b, y, inner)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dx = torch.empty_like(y)
        _launch(bias_relu_backward_kernel, y.numel(), dy.contiguous(), y, dx)
        db = dx.sum(dim=[d for d in range(dx.dim()) if d != 1])
        return dx, db


def bias_relu_cuda(x, b):
    return BiasReLUCuda.apply(x, b)
