"""The answer key: where the course's own answer to each exercise lives.

Read an answer only once your check passes. Each entry maps a chapter's exercise (its check's name) to
the definition that answers it, as "module:qualname" (a tuple of them when the answer is a forward and
its rule, say, the first being the one with the exercise's signature), or to the solved notebook when
the answer lives only there. Every definition named here
starts its docstring with a banner:

    The course's answer to exercise 10.3 (`flash_forward`): read it once your check passes.

and no lesson, hint, check message or module that an exercise imports leads to it before the exercise
(tests/test_answer_key.py walks every such pointer).
"""

SOLVED = "solutions"  # the answer lives only in solutions/NN_topic.ipynb

# ---- chapter 00 ----
CH00 = {
    "numerical_derivative": "course_lib.gradcheck:numerical_derivative",
    "numerical_gradient": "course_lib.gradcheck:numerical_gradient",
    "gradient_check": "course_lib.gradcheck:gradient_check",
}

# ---- chapter 01 ----
CH01 = {
    "mul": ("course_lib.autograd.engine:Value.__mul__", "course_lib.autograd.engine:Value._mul_backward"),
    "exp": ("course_lib.autograd.engine:Value.exp", "course_lib.autograd.engine:Value._exp_backward"),
    "power": ("course_lib.autograd.engine:Value.__pow__", "course_lib.autograd.engine:Value._pow_backward"),
    "tanh": ("course_lib.autograd.engine:Value.tanh", "course_lib.autograd.engine:Value._tanh_backward"),
    "relu": ("course_lib.autograd.engine:Value.relu", "course_lib.autograd.engine:Value._relu_backward"),
    "topological_order": "course_lib.autograd.engine:topological_order",
    "backward": "course_lib.autograd.engine:Value.backward",
    "neuron_call": "course_lib.autograd.nn:Neuron.__call__",
    "mlp_parameters": "course_lib.autograd.nn:MLP.parameters",
    "sgd_step": "course_lib.autograd.nn:sgd_step",
}

# ---- chapter 02 ----
CH02 = {
    "broadcast_shape": "course_lib.tensor.broadcast:shape_broadcast",
    "strided_zip": "course_lib.tensor.broadcast:broadcast_index",
    "strided_reduce": SOLVED,
    "mul_function": "course_lib.tensor.functions:Mul",
    "sum_function": "course_lib.tensor.functions:Sum",
    "tensor_methods": "course_lib.tensor.functions:reduce_dims",
    "matmul_backward": "course_lib.tensor.functions:MatMul",
    "softmax_cross_entropy": ("course_lib.tensor.functions:LogSoftmax", "course_lib.tensor.functions:CrossEntropy"),
    "linear": "course_lib.tensor.linear:Linear",
    "optimizer_steps": ("course_lib.tensor.update_rules:sgd_momentum_step", "course_lib.tensor.update_rules:adam_step"),
}

# ---- chapter 03 ----
CH03 = {
    "topological_order": "course_lib.graph.order:topological_order",
    "run_graph": "course_lib.graph.session:Session",
    "mul_gradient": "course_lib.graph.answers:mul_gradient",
    "matmul_gradient": "course_lib.graph.answers:matmul_gradient",
    "sum_gradient": "course_lib.graph.answers:sum_gradient",
    "gradients": "course_lib.graph.answers:gradients",
    "fold_constants": "course_lib.graph.answers:fold_constants",
    "eliminate_common_subexpressions": "course_lib.graph.answers:eliminate_common_subexpressions",
    "training_loop": SOLVED,
}

# ---- chapter 04 ----
CH04 = {
    "char_tokenizer": "course_lib.gpt.tokenizers:CharTokenizer",
    "bpe_merge_step": ("course_lib.gpt.tokenizers:pair_counts", "course_lib.gpt.tokenizers:merge"),
    "attention_head": "course_lib.gpt.model:causal_attention",
    "split_merge_heads": "course_lib.gpt.model:CausalSelfAttention",
    "block_forward": "course_lib.gpt.model:Block",
    "gpt_forward": "course_lib.gpt.model:GPT.forward",
    "top_k_probs": "course_lib.gpt.generate:top_k_filter",
    "train_step": "course_lib.gpt.trainer:train_step",
    "decode_step": "course_lib.gpt.model:KVCache",
}

# ---- chapter 05 ----
CH05 = {
    "discretize_zoh": "course_lib.mamba.ssm:discretize_zoh",
    "selective_scan": "course_lib.mamba.scan:selective_scan_sequential",
    "combine": "course_lib.mamba.scan:combine",
    "parallel_scan": "course_lib.mamba.scan:associative_scan",
    "causal_conv1d": "course_lib.mamba.model:causal_conv1d",
    "block_forward": "course_lib.mamba.model:MambaBlock.forward",
    "mamba_step": "course_lib.mamba.model:MambaBlock.step",
}

# ---- chapter 06 ----
CH06 = {
    "softplus": SOLVED,
    "position": "course_lib.fast.position:position",
    "strided_map": SOLVED,
    "strided_zip": SOLVED,
    "sum_dim": "course_lib.fast.ops:reduce_kernel",
    "matmul": "course_lib.fast.matmul:matmul_kernel",
    "flat_kernels": ("course_lib.fast.flat:flat_map", "course_lib.fast.flat:flat_zip"),
    "row_layout": "course_lib.fast.flat:kind",
    "strided_copy": "course_lib.fast.ops:map_kernel",
    "sum_columns": "course_lib.fast.flat:flat_reduce_inner",
    "blas_matmul": "course_lib.fast.blas:matmul",
}

# ---- chapter 07 ----
CH07 = {
    "map_add10": "course_lib.cuda.puzzles:k_map_add10",
    "zip_add": "course_lib.cuda.puzzles:k_zip_add",
    "guard_add10": "course_lib.cuda.puzzles:k_guard_add10",
    "map2d_add10": "course_lib.cuda.puzzles:k_map2d_add10",
    "broadcast_add": "course_lib.cuda.puzzles:k_broadcast_add",
    "blocks_add10": "course_lib.cuda.puzzles:k_blocks_add10",
    "blocks2d_add10": "course_lib.cuda.puzzles:k_blocks2d_add10",
    "block_reverse": "course_lib.cuda.puzzles:k_block_reverse",
    "pool3": "course_lib.cuda.puzzles:k_pool3",
    "dot_partial": "course_lib.cuda.puzzles:k_dot_partial",
    "conv1d": "course_lib.cuda.puzzles:k_conv1d",
    "block_scan": "course_lib.cuda.puzzles:k_block_scan",
    "row_sum": "course_lib.cuda.puzzles:k_row_sum",
    "matmul_naive": "course_lib.cuda.matmul:k_matmul_naive",
    "matmul_tiled": "course_lib.cuda.matmul:tiled_kernel",
    "matmul_1d": "course_lib.cuda.matmul:blocked_1d_kernel",
    "matmul_2d": "course_lib.cuda.matmul:blocked_2d_kernel",
}

# ---- chapter 08 ----
CH08 = {
    "bias_relu": SOLVED,
    "custom_op": ("course_lib.custom_ops.bias_relu_op:bias_relu", "course_lib.custom_ops.bias_relu_op:_bias_relu_setup",
                  "course_lib.custom_ops.bias_relu_op:_bias_relu_grad"),
    "im2col": "course_lib.custom_ops.im2col:im2col",
    "conv2d_forward": "course_lib.custom_ops.im2col:conv2d_im2col",
    "conv2d_weight_grad": "course_lib.custom_ops.im2col:conv2d_weight_grad",
    "conv2d_input_grad": ("course_lib.custom_ops.im2col:col2im", "course_lib.custom_ops.im2col:conv2d_input_grad"),
    "conv2d_numba": "course_lib.custom_ops.numba_conv:conv2d_forward",
    "bias_gelu_cpp": SOLVED,
}

# ---- chapter 09 ----
CH09 = {
    "execute": "course_lib.infer.answers:run_graph",
    "gemm": "course_lib.infer.ops.linalg:gemm",
    "softmax": ("course_lib.infer.ops.linalg:softmax", "course_lib.infer.ops.linalg:_softmax",
                "course_lib.infer.ops.linalg:_exp_normalize"),
    "reshape": "course_lib.infer.ops.shape:reshape",
    "fold_constants": "course_lib.infer.answers:fold_constants",
    "fuse_matmul_add": "course_lib.infer.answers:fuse_matmul_add",
}

# ---- chapter 10 ----
CH10 = {
    "online_softmax_update": SOLVED,
    "fused_scan": ("course_lib.fused.scan_cpu:scan_forward", "course_lib.fused.scan_cpu:forward_kernel",
                   "course_lib.fused.scan_cuda:scan_forward_kernel"),
    "flash_forward": ("course_lib.fused.attention_cpu:forward_kernel", "course_lib.fused.attention_cpu:forward_tile"),
    "flash_backward": ("course_lib.fused.attention_cpu:backward_kernel",
                       "course_lib.fused.attention_cpu:backward_key_tile"),
    "flash_forward_cuda": "course_lib.fused.attention_cuda:kernels",
    "attention_op": "course_lib.fused.attention_op:register",
}

# ---- chapter 11 ----
CH11 = {
    "ring_all_reduce": ("course_lib.distributed.collectives:ring_all_reduce",
                        "course_lib.distributed.collectives:chunk_sent",
                        "course_lib.distributed.collectives:chunk_received"),
    "ddp": ("course_lib.distributed.ddp:DDP", "course_lib.distributed.ddp:make_buckets",
            "course_lib.distributed.ddp:broadcast_parameters"),
    "zero_optimizer": "course_lib.distributed.zero:ZeroOptimizer",
    "f_and_g": ("course_lib.distributed.tensor_parallel:CopyToParallel",
                "course_lib.distributed.tensor_parallel:ReduceFromParallel"),
    "parallel_mlp": ("course_lib.distributed.tensor_parallel:ParallelMLP",
                     "course_lib.distributed.tensor_parallel:my_slice"),
}

# ---- chapter 12 ----
CH12 = {"softmax_function": "course_lib.capstone.functions:Softmax",
        "gelu_function": "course_lib.capstone.functions:GELU",
        "layer_norm_function": "course_lib.capstone.functions:LayerNorm",
        "embedding_function": "course_lib.capstone.functions:Embedding",
        "masked_fill_function": "course_lib.capstone.functions:MaskedFill",
        "attention_function": "course_lib.capstone.functions:CausalAttention",
        "block": ("course_lib.capstone.model:Block", "course_lib.capstone.model:MLP",
                  "course_lib.capstone.model:CausalSelfAttention"),
        "gpt": "course_lib.capstone.model:GPT",
        "adamw": ("course_lib.capstone.optim:AdamW", "course_lib.capstone.optim:param_groups"),
        "lr_schedule": ("course_lib.capstone.optim:lr_at", "course_lib.gpt.schedule:lr_at"),
        "clip_grad_norm": "course_lib.capstone.optim:clip_grad_norm",
        "checkpoint": ("course_lib.capstone.train:save_checkpoint", "course_lib.capstone.train:load_checkpoint"),
        "train": "course_lib.capstone.train:train",
        "generate": "course_lib.capstone.sample:generate"}

# ---- chapter 13 ----
CH13 = {"record": "course_lib.compiler.answers:record",
        "can_join": "course_lib.compiler.answers:can_join",
        "pointwise_source": "course_lib.compiler.answers:pointwise_source",
        "guard": "course_lib.compiler.answers:guard"}

# ---- chapter 14 ----
CH14 = {
    "block_manager": "course_lib.serve.blocks:BlockManager",
    "paged_attention": "course_lib.serve.paged_attention:paged_attention",
    "schedule": "course_lib.serve.scheduler:schedule",
    "speculative_accept": "course_lib.serve.acceptance:accept",
    "int8_linear": ("course_lib.serve.int8:quantize", "course_lib.serve.int8:int8_matmul",
                    "course_lib.serve.int8:output_channel"),
}

ANSWERS = {chapter: table for chapter, table in (
    ("00", CH00), ("01", CH01), ("02", CH02), ("03", CH03), ("04", CH04), ("05", CH05), ("06", CH06),
    ("07", CH07), ("08", CH08), ("09", CH09), ("10", CH10), ("11", CH11), ("12", CH12), ("13", CH13),
    ("14", CH14))}
