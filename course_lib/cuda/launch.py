"""Launch a kernel the way a real GPU would accept it, on a GPU or on Numba's simulator.

    out = np.empty_like(a)
    run = launch(add_ten, 1, 32, a, out)      # a and out are copied in, out is copied back
    run.device                                 # "simulator" or the GPU's name

The simulator is generous: it runs 2048 threads per block, any amount of shared
memory, and shared or local arrays whose size is an expression (`TPB + 2`). A real GPU
refuses all three (the last when the kernel compiles). `launch` refuses them too, with a
clear message, so code that passes here also launches there.
"""

import ast
import functools
import inspect
import sys
import textwrap
import threading
import time
from dataclasses import dataclass

import numpy as np

from course_lib import device

device.setup(verbose=False)
from numba import cuda  # noqa: E402  (after the device is chosen)

# Limits shared by every NVIDIA GPU since compute capability 3.0.
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIM = (1024, 1024, 64)
MAX_GRID_DIM = (2**31 - 1, 65535, 65535)
MAX_SHARED_BYTES = 48 * 1024          # static shared memory per block
SIMULATOR_THREAD_BUDGET = 20_000      # the simulator runs ~130 µs per thread: keep launches small


class LaunchError(ValueError):
    """A launch configuration that a real GPU would refuse."""


@dataclass
class Run:
    device: str      # "simulator" or the GPU's name
    grid: tuple
    block: tuple
    threads: int     # threads launched in all
    seconds: float   # wall time of the launch and the copies

    def __repr__(self):
        return f"Run(device={self.device!r}, grid={self.grid}, block={self.block}, threads={self.threads})"


def _dims(d, what):
    d = (d,) if np.isscalar(d) else tuple(d)
    if not 1 <= len(d) <= 3 or any(int(v) != v or v < 1 for v in d):
        raise LaunchError(f"{what} must be 1 to 3 positive integers, got {d}")
    return tuple(int(v) for v in d)


def check_config(grid, block, shared_bytes=0):
    """Raise LaunchError for a configuration a real GPU would refuse; return (grid, block)."""
    grid, block = _dims(grid, "grid"), _dims(block, "block")
    threads = int(np.prod(block))
    if threads > MAX_THREADS_PER_BLOCK:
        raise LaunchError(f"block {block} has {threads} threads; a GPU allows at most "
                          f"{MAX_THREADS_PER_BLOCK} per block. Use smaller blocks and more of them.")
    for axis, (b, lim) in enumerate(zip(block, MAX_BLOCK_DIM)):
        if b > lim:
            raise LaunchError(f"block size {b} along axis {'xyz'[axis]} exceeds the GPU limit {lim}")
    for axis, (g, lim) in enumerate(zip(grid, MAX_GRID_DIM)):
        if g > lim:
            raise LaunchError(f"grid size {g} along axis {'xyz'[axis]} exceeds the GPU limit {lim}")
    if shared_bytes > MAX_SHARED_BYTES:
        raise LaunchError(f"{shared_bytes} bytes of dynamic shared memory asked; a block gets at most "
                          f"{MAX_SHARED_BYTES}")
    return grid, block


_ALLOCATING = threading.Lock()


class _SharedMeter:
    """On the simulator, count each block's shared-memory bytes and refuse more than a GPU has."""

    def __init__(self, dynamic_bytes):
        self.dynamic = dynamic_bytes

    def __enter__(self):
        from numba.core import types
        from numba.cuda.simulator import kernelapi
        from numba.np import numpy_support

        self.cls, self.original = kernelapi.FakeCUDAShared, kernelapi.FakeCUDAShared.array
        meter = self

        def array(shared, shape, dtype, alignment=None):
            if shape == 0 or alignment is not None:                 # dynamic shared memory
                return meter.original(shared, shape, dtype, alignment)
            # The simulator tells arrays apart by the kernel line that made them.
            caller = sys._getframe(1)
            key = (caller.f_code.co_filename, caller.f_lineno)
            # The block's threads are Python threads: without the lock, two of them can both see
            # no array yet and each make its own, so they no longer share (a wrong sum, no error).
            with _ALLOCATING:
                if key not in shared._allocations:
                    dtype = numpy_support.as_dtype(dtype) if isinstance(dtype, types.Type) else dtype
                    shared._allocations[key] = np.empty(shape, dtype)
                    used = meter.dynamic + sum(a.nbytes for a in shared._allocations.values())
                    if used > MAX_SHARED_BYTES:
                        raise LaunchError(f"the kernel asks for {used} bytes of shared memory per block; "
                                          f"a GPU gives a block at most {MAX_SHARED_BYTES}")
                return shared._allocations[key]

        self.cls.array = array
        return self

    def __exit__(self, *exc):
        self.cls.array = self.original


_ARRAY_MAKERS = ("shared", "local")     # cuda.shared.array(shape, dtype), cuda.local.array(shape, dtype)


@functools.cache
def _non_constant_sizes(fn):
    """The shared and local array calls in fn whose shape the compiler cannot see as a constant.

    A GPU compiles these arrays with their size: an int literal, a name bound outside the kernel to
    an int or a tuple of ints (a global or a closure's variable), or a tuple of those. `TPB + 2`, `a.shape[0]` or
    `len(w)` are computed when the kernel runs, too late. Returns the offending calls' source text.
    """
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return ()                                           # no source to read: the compiler will tell
    outside = dict(fn.__globals__)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            outside[name] = cell.cell_contents
        except ValueError:                                  # a closure variable not bound yet
            pass
    local_ints = _locals_assigned_only_ints(tree)

    def constant(node):
        if isinstance(node, ast.Constant):
            return isinstance(node.value, int)
        if isinstance(node, ast.Name):
            value = outside.get(node.id)
            ints = isinstance(value, int) or (isinstance(value, tuple) and all(isinstance(v, int) for v in value))
            return ints or node.id in local_ints
        if isinstance(node, ast.Attribute):                 # a module's constant, e.g. P.TPB
            return True
        if isinstance(node, ast.Tuple):
            return all(constant(e) for e in node.elts)
        return False

    def makes_array(call):                                 # cuda.shared.array(...) or cuda.local.array(...)
        f = call.func
        return (isinstance(f, ast.Attribute) and f.attr == "array" and isinstance(f.value, ast.Attribute)
                and f.value.attr in _ARRAY_MAKERS)

    return tuple(ast.get_source_segment(source, node) for node in ast.walk(tree)
                 if isinstance(node, ast.Call) and makes_array(node) and node.args and not constant(node.args[0]))


def _locals_assigned_only_ints(tree):
    """Names assigned in the function, every time to an int literal."""
    values = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    values.setdefault(target.id, []).append(node.value)
    return {n for n, vs in values.items() if all(isinstance(v, ast.Constant) and isinstance(v.value, int) for v in vs)}


def check_array_sizes(kernel):
    """Raise LaunchError if the kernel sizes a shared or local array with an expression."""
    fn = getattr(kernel, "py_func", None)
    bad = _non_constant_sizes(fn) if inspect.isfunction(fn) else ()
    if bad:
        raise LaunchError(f"{fn.__name__}: `{bad[0]}` sizes an array with an expression. A GPU compiles shared "
                          f"and local arrays with a size fixed at compile time: a number, or a name defined "
                          f"outside the kernel (like TPB). Name the size once next to TPB, e.g. `SIZE = TPB + 2`, "
                          f"and use the name. The simulator would run it; a GPU's compiler refuses it.")


def device_name():
    """"simulator" or the name of the GPU."""
    if device.using_simulator():
        return "simulator"
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


def launch(kernel, grid, block, *args, shared_bytes=0, max_sim_threads=SIMULATOR_THREAD_BUDGET):
    """Run `kernel[grid, block](*args)` under real-GPU limits and return a `Run`.

    Numpy arrays among `args` are copied to the device and copied back into the same
    arrays afterwards, so outputs appear in place. Scalars pass through unchanged.
    On the simulator, launches above `max_sim_threads` threads are refused (they would
    take minutes); pass a larger number if you really mean it.
    """
    grid, block = check_config(grid, block, shared_bytes)
    check_array_sizes(kernel)
    threads = int(np.prod(grid)) * int(np.prod(block))
    sim = device.using_simulator()
    if sim and threads > max_sim_threads:
        raise LaunchError(f"{threads} threads would take about {threads * 130e-6:.0f} s on the simulator "
                          f"(~130 µs each); keep launches under {max_sim_threads} threads "
                          f"or pass max_sim_threads=")
    start = time.perf_counter()
    on_device = [cuda.to_device(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a for a in args]
    config = (grid, block, 0, shared_bytes) if shared_bytes else (grid, block)
    if sim:
        with _SharedMeter(shared_bytes):
            kernel[config](*on_device)
    else:
        kernel[config](*on_device)
        cuda.synchronize()
    for a, d in zip(args, on_device):
        if isinstance(a, np.ndarray):
            a[...] = d.copy_to_host()
    return Run(device_name(), grid, block, threads, time.perf_counter() - start)


def blocks_for(n, per_block):
    """How many blocks of `per_block` threads cover n items: ceil(n / per_block)."""
    return (n + per_block - 1) // per_block
