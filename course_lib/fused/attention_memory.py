"""How much memory attention needs beyond its inputs: O(T d) for the tiled kernel, O(T^2) for naive attention.

    curve = memory_curve([512, 1024, 2048, 4096])      # {"fused": [bytes, ...], "naive": [...], "sdpa": [...]}

The measurement is the process's peak resident memory (Linux only). The kernel keeps the peak in
/proc/self/status (VmHWM), and writing 5 to /proc/self/clear_refs resets it to the current size:

    reset the peak;  before = VmRSS;  run the call;  extra = VmHWM - before

That counts every page the call touched, whoever allocated it: torch's tensors, the arrays the Numba
kernel makes in its tasks, BLAS's buffers. (tracemalloc would see only Python's and numpy's own
allocations, the torch profiler only torch's.) Two details keep the number honest:

- glibc keeps freed blocks of up to 32 MB for reuse once big blocks have come and go, so a second run
  would reuse memory that is already resident and look free. MALLOC_MMAP_THRESHOLD_=65536 makes it
  map every block over 64 KB on its own and unmap it when freed;
- each method runs in a fresh subprocess, and runs once at a small T first (Numba compiles, torch
  warms up); the inputs are made before the reset. So only the call's own working memory counts.
"""

import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

from course_lib.fused.attention_op import attention, naive_attention

METHODS = {
    "fused": lambda q, k, v, causal: attention(q, k, v, causal),
    "naive": lambda q, k, v, causal: naive_attention(q, k, v, causal),
    "sdpa": lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
}


def _status_bytes(field):
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024          # the file says kB


def peak_extra_bytes(fn):
    """Resident memory that fn() adds at its peak, above what the process held when it began."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                            # peak := current
    before = _status_bytes("VmRSS")
    fn()
    return _status_bytes("VmHWM") - before


def measure(method, Ts, B=1, H=4, d=64, causal=True, grad=False):
    """Extra bytes of `method` (a METHODS key) for each T, forward only or forward and backward (grad),
    in this process: run it through `memory_curve` for numbers unaffected by earlier runs."""
    fn = METHODS[method]

    def one_call(T):
        g = torch.Generator().manual_seed(T)
        q, k, v = (torch.randn(B, H, T, d, generator=g, requires_grad=grad) for _ in range(3))
        if not grad:
            with torch.no_grad():
                return lambda: fn(q, k, v, causal)
        dout = torch.randn(B, H, T, d, generator=g)
        return lambda: fn(q, k, v, causal).backward(dout)

    one_call(37)()                                # compile and warm up, outside the measurement
    results = []
    for T in Ts:
        call = one_call(T)
        with torch.set_grad_enabled(grad):
            results.append(peak_extra_bytes(call))
    return results


def memory_curve(Ts=(512, 1024, 2048, 4096), methods=("fused", "naive", "sdpa"), B=1, H=4, d=64, causal=True, grad=False):
    """{method: [extra bytes at each T]}, each method measured in a fresh subprocess (see the docstring)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    curve = {}
    for method in methods:
        args = json.dumps(dict(method=method, Ts=list(Ts), B=B, H=H, d=d, causal=causal, grad=grad))
        run = subprocess.run([sys.executable, "-m", "course_lib.fused.attention_memory", args],
                             env=env, capture_output=True, text=True, check=True)
        curve[method] = json.loads(run.stdout.strip().splitlines()[-1])
    return curve


if __name__ == "__main__":
    print(json.dumps(measure(**json.loads(sys.argv[1]))))
