"""Chapter 10: fused kernels. One pass over the data instead of one per operation, nothing big stored.

- `fastexp`   exp(z) for z <= 0 from multiplies, adds and bit operations, so that loops of it vectorize
- `tiles`     small matrix products whose sums stay in registers: the attention kernels' tile products
- `scan_cpu`  the selective scan fused in Numba (discretize, scan, read out), forward and backward
- `scan_cuda` the same as Numba CUDA kernels, one thread per (batch, channel)
- `scan_op`   both as a torch.library.custom_op, and `selective_scan_fused` (MambaConfig(scan="fused"))
- `attention_cpu`    FlashAttention-2 in Numba: tiles, an online softmax, no T x T matrix, forward and backward
- `attention_cuda`   the forward and backward as Numba CUDA kernels, one block per (head, tile of queries)
- `attention_op`     both as a torch.library.custom_op; `attention(q, k, v, causal)`, GPTConfig(fused=True)
- `attention_memory` the memory a call allocates while it runs (tracemalloc), against T

Import the module you need (`from course_lib.fused.attention_op import attention`): the package
itself imports nothing, so that `fastexp` and `tiles` come without the kernels that use them.
"""
