"""Chapter 10: fused kernels. One pass over the data instead of one per operation, nothing big stored.

- `scan_cpu`  the selective scan fused in Numba (discretize, scan, read out), forward and backward
- `scan_cuda` the same as Numba CUDA kernels; `scan_gpu` laid out for a GPU's speed (a block per channel group)
- `warps`     warp shuffles taught to Numba's CUDA simulator, so the GPU layouts run without a GPU
- `scan_op`   both as a torch.library.custom_op, and `selective_scan_fused`, with chapter 05's signature
- `attention_cpu`    FlashAttention-2 in Numba: tiles, an online softmax, no T x T matrix, forward and backward
- `attention_cuda`   the forward and backward as Numba CUDA kernels, one thread a row (the exercise's layout)
- `attention_gpu`    the same laid out for a GPU's speed: tiles, register blocks, warp shuffles, exp2
- `attention_op`     both as a torch.library.custom_op; `attention(q, k, v, causal)`
- `attention_memory` the memory a call allocates while it runs (tracemalloc), against T
- `models`    chapter 04's GPT and chapter 05's Mamba on these kernels: `with models.running(): ...`

Several of these files hold the course's answers to the chapter's exercises (course_lib/answer_key.py
says which definitions): read those once your checks pass. The building blocks the kernels share, an exp
that vectorizes and the tile products, are in course_lib.simd (`fastexp` and `tiles` here only point
there, for code saved before they moved).

Import the module you need (`from course_lib.fused.attention_op import attention`): the package itself
imports nothing, so that numba and torch load only when asked for.
"""
