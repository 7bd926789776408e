"""Chapter 02: a PyTorch-like tensor library with autograd, modules and optimizers.

Layers, one idea per file:
    tensor_data.py    storage, shape, strides, views
    broadcast.py      the shape two operands broadcast to, and the index each one reads
    backend.py        the backend interface (map, zip, reduce, matmul) and backend selection
    numpy_backend.py  the numpy reference backend
    autodiff.py       Function, Context, no_grad, and the backward pass
    functions.py      every op: its forward and, beside it, its derivative rule
    registry.py       which Function each op applies (`use_ops` puts others in)
    tensor.py         the Tensor class and its torch-like API
    module.py         Module and Parameter, the frame of every layer
    linear.py, nn.py  the Linear layer, and the others
    update_rules.py   SGD's and Adam's update rules, which optim.py applies to every parameter at once
    data.py           a tiny DataLoader

broadcast.py, functions.py (Mul, Sum, reduce_dims, MatMul, LogSoftmax, CrossEntropy), linear.py and
update_rules.py hold the course's answers to chapter 02's exercises, each marked with the exercise it
answers: read them once your checks pass.
"""

from course_lib.tensor import nn, optim  # noqa: F401,E402
from course_lib.tensor.autodiff import Function, is_grad_enabled, no_grad  # noqa: F401,E402
from course_lib.tensor.backend import (  # noqa: F401
    MAP_OPS,
    REDUCE_OPS,
    ZIP_OPS,
    Backend,
    BackendUnavailable,
    available_backends,
    backend_status,
    current_backend,
    current_backend_name,
    get_backend,
    register_backend,
    set_backend,
    use_backend,
)
from course_lib.tensor.data import DataLoader  # noqa: F401,E402
from course_lib.tensor.registry import OPS, use_ops  # noqa: F401,E402
from course_lib.tensor.tensor import (  # noqa: F401,E402
    Tensor,
    arange,
    cat,
    cross_entropy,
    float32,
    float64,
    generator,
    log_softmax,
    manual_seed,
    matmul,
    one_hot,
    ones,
    rand,
    randn,
    softmax,
    stack,
    tensor,
    where,
    zeros,
    zeros_like,
)
from course_lib.tensor.tensor_data import ShapeError, TensorData  # noqa: F401
