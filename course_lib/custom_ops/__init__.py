"""Chapter 08: custom PyTorch operators.

- `numba_kernels`: the CPU kernels (bias+ReLU, conv2d forward/backward, max pooling);
- `conv`, `pool`: conv2d and max pooling in plain torch code (loops, im2col, col2im);
- `functions`: torch.autograd.Function wrappers around both;
- `numba_cuda`: the bias+ReLU as Numba CUDA kernels in a Function (zero-copy on a GPU, else the simulator);
- `library`: the same kernels registered with torch.library.custom_op;
- `cpp`: a C++ (and CUDA) op built with torch.utils.cpp_extension.load_inline;
- `cnn`: a digits CNN on the custom ops, and the same net on torch.nn.
"""
