"""The kernels. Importing this package fills the registry."""

from . import conv, elementwise, fused, linalg, nn, reduce, shape  # noqa: F401
