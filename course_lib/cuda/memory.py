"""Device memory for tensors that stay on the GPU: a flat storage, and a caching pool behind it.

A `TensorData` (tensor/tensor_data.py) is a flat storage plus shape, strides and offset. On the CUDA
backend the storage is a `DeviceStorage`: memory on the device, which the host reads only by
copying it (`copy_to_host`, which `TensorData.to_numpy` calls, so `.numpy()`, `.item()` and printing
work unchanged, and are the only moments data crosses back).

Asking the driver for memory (cuMemAlloc) and giving it back is slow, and a training loop allocates
the same sizes at every step. So, like PyTorch's caching allocator, the pool keeps the memory of a
storage that Python frees and hands it to the next storage of the same size and dtype. Reuse is
safe without synchronizing: every kernel runs on one stream, in order, so a kernel that writes the
reused memory runs after every kernel that read it before. (What must hold is the storage itself, not
only its `array`, until the launch: a storage that Python frees gives its array to the next one.)
"""

import numpy as np

from course_lib import device

device.setup(verbose=False)
from numba import cuda  # noqa: E402  (after the device is chosen)


class Pool:
    """Free device arrays by (number of elements, dtype), kept for reuse up to `limit` bytes."""

    def __init__(self, limit=2 << 30):
        self.free, self.limit, self.cached = {}, limit, 0
        self.allocated = 0          # arrays asked from the driver (a test counts them)

    def take(self, size, dtype):
        size = max(size, 1)                 # an empty storage still gets one element (a valid pointer)
        stack = self.free.get((size, dtype))
        if stack:
            array = stack.pop()
            self.cached -= array.nbytes
            return array
        self.allocated += 1
        return cuda.device_array(size, dtype)

    def give_back(self, array):
        if self.cached + array.nbytes <= self.limit:
            self.free.setdefault((array.size, np.dtype(array.dtype)), []).append(array)
            self.cached += array.nbytes

    def clear(self):
        """Forget the cached arrays (Numba frees their memory)."""
        self.free.clear()
        self.cached = 0


POOL = Pool()


class DeviceStorage:
    """A flat array in device memory, the storage of a TensorData on the CUDA backend.

    `array` is the Numba device array the kernels take. It has what TensorData asks of a storage
    (ndim, size, dtype, itemsize); a read from the host is a copy (`copy_to_host`)."""

    __slots__ = ("array", "size", "dtype", "__weakref__")
    ndim = 1

    def __init__(self, array):
        self.array, self.size, self.dtype = array, int(array.size), np.dtype(array.dtype)

    @classmethod
    def empty(cls, size, dtype):
        array = POOL.take(int(size), np.dtype(dtype))
        storage = cls(array)
        storage.size = int(size)            # 0 for an empty storage, which holds one element
        return storage

    @classmethod
    def upload(cls, host):
        """A copy on the device of a flat host array."""
        host = np.ascontiguousarray(host).reshape(-1)
        storage = cls.empty(host.size, host.dtype)
        if host.size:
            storage.array.copy_to_device(host)
        return storage

    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def nbytes(self):
        return self.size * self.itemsize

    def copy_to_host(self):
        """The values, copied to a new host array (this waits for the kernels that write them)."""
        if self.size == 0:
            return np.empty(0, self.dtype)
        host = self.array.copy_to_host()
        return host[:self.size] if host.size != self.size else host

    def __len__(self):
        return self.size

    def __del__(self):
        try:
            POOL.give_back(self.array)
        except Exception:  # noqa: BLE001  (at interpreter exit the pool may be gone)
            pass

    def __repr__(self):
        return f"DeviceStorage({self.size} x {self.dtype})"
