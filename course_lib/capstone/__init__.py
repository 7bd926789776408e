"""Chapter 12, the capstone: chapter 04's GPT and its whole training, on the course's own tensor library.

These files hold the course's answers to chapter 12's exercises, each definition marked as such. Read
one once your check of that exercise passes (course_lib/answer_key.py lists where each answer is).

- `functions`  the six fused Functions (softmax, GELU, layer norm, embedding, masked fill, attention)
- `model`      the Block and the GPT, with chapter 04's parameter names and initialisation
- `optim`      AdamW with parameter groups, the learning-rate schedule, clipping by the global norm
- `train`      checkpoints and the training loop
- `sample`     sampling with temperature and top-k
- `recipe`     (no answers) chapter 04's recipe on these pieces, for chapter 13, the tests and benchmarks
"""

from course_lib.capstone.model import GPT  # noqa: F401
from course_lib.capstone.recipe import COURSE, configure_optimizer, train_step  # noqa: F401
