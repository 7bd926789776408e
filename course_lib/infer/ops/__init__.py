"""The kernels. Importing this package fills the registry."""

from . import attention, control, conv, elementwise, fused, image, linalg, losses, nn, reduce, shape  # noqa: F401
