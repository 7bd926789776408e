"""Chapter 08: custom PyTorch operators.

- `numba_kernels`: the CPU kernels (bias+ReLU, conv2d forward/backward, max pooling);
- `conv`, `pool`: conv2d (loops) and max pooling in plain torch code, `geometry` their windows' arithmetic;
- `im2col`: im2col, col2im and conv2d on them, forward and both gradients;
- `numba_conv`: conv2d as Numba kernels, the forward and both gradients;
- `functions`: torch.autograd.Function wrappers around both;
- `numba_cuda`: the bias+ReLU as Numba CUDA kernels in a Function (zero-copy on a GPU, else the simulator);
- `library`: the same kernels registered with torch.library.custom_op; `bias_relu_op` the fused bias + ReLU as one;
- `cpp`: a C++ (and CUDA) op built with torch.utils.cpp_extension.load_inline;
- `cnn`: a digits CNN on the custom ops, and the same net on torch.nn.

`im2col` (im2col, col2im, the im2col forward and both gradients), `numba_conv` (the forward kernel) and
`bias_relu_op` (the bias + ReLU custom op) hold the course's answers to chapter 08's exercises, each
marked with the exercise it answers: read them once your checks pass.
"""
