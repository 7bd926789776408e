"""The kernels. Importing this package fills the registry."""

from . import elementwise, linalg, nn, reduce, shape  # noqa: F401
