"""The answer key: where the course's own answer to each exercise lives.

Read an answer only once your check passes. Each entry maps a chapter's exercise (its check's name) to
the definition that answers it, as "module:qualname", or to the solved notebook when the answer lives only
there. Every definition named here starts its docstring with a banner:

    The course's answer to exercise 10.3 (`flash_forward`): read it once your check passes.

and no lesson, hint, check message or module that an exercise imports leads to it before the exercise
(tests/test_answer_key.py walks every such pointer).
"""

SOLVED = "solutions"  # the answer lives only in solutions/NN_topic.ipynb

# ---- chapter 00 ----
CH00 = {}

# ---- chapter 01 ----
CH01 = {}

# ---- chapter 02 ----
CH02 = {}

# ---- chapter 03 ----
CH03 = {}

# ---- chapter 04 ----
CH04 = {}

# ---- chapter 05 ----
CH05 = {}

# ---- chapter 06 ----
CH06 = {}

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
CH08 = {}

# ---- chapter 09 ----
CH09 = {}

# ---- chapter 10 ----
CH10 = {
    "online_softmax_update": SOLVED,
    "fused_scan": "course_lib.fused.scan_cpu:scan_forward",
    "flash_forward": "course_lib.fused.attention_cpu:forward_kernel",
    "flash_backward": "course_lib.fused.attention_cpu:backward_kernel",
    # 10.5, `flash_forward_cuda`: its line comes with the CUDA exercise
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
        "block": "course_lib.capstone.model:Block",
        "gpt": "course_lib.capstone.model:GPT",
        "adamw": "course_lib.capstone.optim:AdamW",
        "lr_schedule": "course_lib.capstone.optim:lr_at",
        "clip_grad_norm": "course_lib.capstone.optim:clip_grad_norm",
        "checkpoint": "course_lib.capstone.train:save_checkpoint",
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
    "int8_linear": ("course_lib.serve.int8:quantize", "course_lib.serve.int8:int8_matmul"),
}

ANSWERS = {chapter: table for chapter, table in (
    ("00", CH00), ("01", CH01), ("02", CH02), ("03", CH03), ("04", CH04), ("05", CH05), ("06", CH06),
    ("07", CH07), ("08", CH08), ("09", CH09), ("10", CH10), ("11", CH11), ("12", CH12), ("13", CH13),
    ("14", CH14))}
