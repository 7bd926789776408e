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
CH07 = {}

# ---- chapter 08 ----
CH08 = {}

# ---- chapter 09 ----
CH09 = {}

# ---- chapter 10 ----
CH10 = {}

# ---- chapter 11 ----
CH11 = {}

# ---- chapter 12 ----
CH12 = {}

# ---- chapter 13 ----
CH13 = {}

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
