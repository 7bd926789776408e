"""Watch a kernel work: run it in plain Python and record every array access.

    t = trace(k_pool3, grid=2, block=8, a=a, out=out)
    t.draw()                        # one grid per array: who read and who wrote each cell
    t.draw(highlight=(0, 3))        # only what thread 3 of block 0 touched
    t.warp_report()                 # memory transactions and bank conflicts per warp access
    t.draw_steps("buf (shared, block 0)")   # one shared array, barrier phase by barrier phase
    print(t.profile(multiply_adds=m * n * k))    # the launch's memory traffic, conflicts and hazards
    t.races()                       # pairs of threads that touch one address with no barrier between

The kernel's own Python source runs, one Python thread per CUDA thread, with a stand-in
for `numba.cuda` (the module-level name `cuda` in the kernel's globals is swapped for
it). `syncthreads` is a real barrier. Every array, global or shared, is wrapped so
that each read and write is logged with the block, thread, index, barrier phase and source
line. Unlike the simulator, the tracer also flags negative indices, which wrap silently.

So the tracer is a profiler and a sanitizer for machines without a GPU, the counterpart of
Nsight Compute and compute-sanitizer on one:
- memory traffic: global loads and stores, the 32-byte sectors each warp access touches, and
  accesses that touch more than twice the sectors their bytes need (uncoalesced);
- shared memory: each warp access's bank conflict (the most distinct words one bank serves);
- out-of-bounds and negative indices (`sanitize` records them instead of stopping);
- races: two threads of a block that touch one shared or global address in the same barrier
  phase, at least one of them writing, are not ordered, so a write may land before or after
  the other thread's access. Each race is named with both threads and both source lines.
Local arrays (`cuda.local.array`) are registers: the tracer does not count them.
"""

import linecache
import re
import sys
import threading
import types
from collections import defaultdict, namedtuple
from dataclasses import dataclass, field

import numba
import numpy as np
from numba import cuda as _real_cuda

Access = namedtuple("Access", "block thread array index kind phase order line")
Race = namedtuple("Race", "array index block phase first second")          # first, second: Access


class KernelTraceError(RuntimeError):
    """A kernel did something a GPU would not allow (out of bounds, a negative index, a deadlock)."""


class _Dim(namedtuple("Dim", "x y z")):
    pass


def _dim3(d):
    d = (d,) if np.isscalar(d) else tuple(d)
    return _Dim(*(tuple(int(v) for v in d) + (1, 1, 1))[:3])


class _Array:
    """A numpy array that logs each element access to the trace."""

    def __init__(self, data, name, tracer):
        self.data, self.name, self.tracer = data, name, tracer
        self.shape, self.size, self.ndim, self.dtype = data.shape, data.size, data.ndim, data.dtype

    def _index(self, idx):
        """The index as a tuple of ints, or None for an out-of-bounds access the tracer records."""
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != self.ndim or not all(isinstance(i, (int, np.integer)) for i in idx):
            raise KernelTraceError(f"{self.name}[{idx}]: the tracer follows one element at a time")
        idx = tuple(int(i) for i in idx)
        for i, n in zip(idx, self.shape):
            if i < 0:
                return self.tracer.out_of_bounds(
                    f"{self.name}{list(idx)} by {self.tracer.who()} at {self.tracer.where()}: a negative index. "
                    f"The simulator would wrap it silently to the end of the array; "
                    f"a GPU would read memory before the array.")
            if i >= n:
                return self.tracer.out_of_bounds(
                    f"{self.name}{list(idx)} by {self.tracer.who()} at {self.tracer.where()}: out of bounds "
                    f"(shape {self.shape}). A guard `if i < n:` is missing.")
        return idx

    def __getitem__(self, idx):
        idx = self._index(idx)
        if idx is None:                             # recorded; the thread goes on with a zero
            return self.dtype.type(0)
        self.tracer.log(self.name, idx, "read")
        return self.data[idx]

    def __setitem__(self, idx, value):
        idx = self._index(idx)
        if idx is None:
            return
        self.tracer.log(self.name, idx, "write")
        self.data[idx] = value

    def __len__(self):
        return self.shape[0]


class Tracer:
    def __init__(self, grid, block, record_errors=False):
        self.grid, self.block = _dim3(grid), _dim3(block)
        self.local = threading.local()
        self.events = []
        self.lock = threading.Lock()
        self.shared = {}
        self.record_errors, self.errors = record_errors, []
        self.code = self.source = None                # the kernel's code and file: accesses are logged at its lines

    def who(self):
        return f"thread {tuple(self.local.thread)[:self._nd()]} of block {tuple(self.local.block)[:self._nd()]}"

    def where(self):
        return f"line {self._line()}"

    def _nd(self):
        return _ndim(self.grid, self.block)

    def _line(self):
        """The line of the kernel's source that is running in this thread (0 if none is found)."""
        frame = sys._getframe(2)
        while frame is not None and frame.f_code is not self.code:
            frame = frame.f_back
        return frame.f_lineno if frame is not None else 0

    def out_of_bounds(self, message):
        """Raise KernelTraceError, or (sanitize) record the message and let the thread go on."""
        if not self.record_errors:
            raise KernelTraceError(message)
        with self.lock:
            self.errors.append(message)
        return None

    def log(self, name, idx, kind):
        loc = self.local
        loc.order += 1
        line = self._line()
        with self.lock:
            self.events.append(Access(loc.blk_id, loc.thr_id, name, idx, kind, loc.phase, loc.order, line))

    # --- the stand-in for numba.cuda -------------------------------------------------
    def module(self):
        tr = self

        def grid(ndim):
            b, t = tr.local.block, tr.local.thread
            pos = [b[a] * tr.block[a] + t[a] for a in range(3)]
            return pos[0] if ndim == 1 else tuple(pos[:ndim])

        def gridsize(ndim):
            size = [tr.grid[a] * tr.block[a] for a in range(3)]
            return size[0] if ndim == 1 else tuple(size[:ndim])

        def syncthreads():
            tr.local.phase += 1
            try:
                tr.barrier.wait(timeout=10)
            except threading.BrokenBarrierError:
                raise KernelTraceError("syncthreads(): not every thread of the block reached this barrier "
                                 "(one inside an `if` that some threads skip?). On a GPU this hangs "
                                 "or corrupts results.") from None

        def shared_array(shape, dtype, alignment=None):
            caller = sys._getframe(1)
            key = (tr.local.blk_id, caller.f_code.co_filename, caller.f_lineno)
            with tr.lock:
                if key not in tr.shared:
                    dt = numba.np.numpy_support.as_dtype(dtype) if isinstance(dtype, numba.types.Type) else dtype
                    name = f"{_target(caller)} (shared, block {key[0]})"
                    arr = np.full(shape, np.nan) if np.dtype(dt).kind == "f" else np.zeros(shape, dt)
                    tr.shared[key] = _Array(arr.astype(dt), name, tr)
            return tr.shared[key]

        def local_array(shape, dtype):
            dt = numba.np.numpy_support.as_dtype(dtype) if isinstance(dtype, numba.types.Type) else dtype
            return np.zeros(shape, dt)

        class _Idx:
            def __init__(self, attr):
                self.attr = attr

            def __get__(self, obj, cls=None):
                return getattr(tr.local, self.attr)

        # The parts of numba.cuda a kernel uses, answered for the calling Python thread.
        cls = type("FakeCuda", (types.SimpleNamespace,), {"threadIdx": _Idx("thread"), "blockIdx": _Idx("block")})
        return cls(blockDim=self.block, gridDim=self.grid, grid=grid, gridsize=gridsize, warpsize=32,
                   syncthreads=syncthreads,
                   shared=types.SimpleNamespace(array=shared_array),
                   local=types.SimpleNamespace(array=local_array))

    # --- running -------------------------------------------------------------------------
    def run(self, kernel, args):
        fn = getattr(kernel, "py_func", kernel)
        fake = self.module()
        glob = {k: (fake if v is _real_cuda else v) for k, v in fn.__globals__.items()}
        fn = types.FunctionType(fn.__code__, glob, fn.__name__, fn.__defaults__, fn.__closure__)
        self.code, self.source = fn.__code__, fn.__code__.co_filename
        errors = []

        def body(blk, thr, blk_id, thr_id):
            loc = self.local
            loc.block, loc.thread, loc.blk_id, loc.thr_id = _Dim(*blk), _Dim(*thr), blk_id, thr_id
            loc.phase, loc.order = 0, 0
            try:
                fn(*args)
            except Exception as e:          # noqa: BLE001  (reported after the block)
                errors.append(e)
                self.barrier.abort()

        nthreads = int(np.prod(self.block))
        for blk_id, blk in enumerate(np.ndindex(*self.grid[::-1])):
            blk = blk[::-1]
            self.barrier = threading.Barrier(nthreads)
            threads = [threading.Thread(target=body, args=(blk, thr[::-1], blk_id, thr_id))
                       for thr_id, thr in enumerate(np.ndindex(*self.block[::-1]))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                first = next((e for e in errors if not isinstance(e, KernelTraceError) or "barrier" not in str(e)), errors[0])
                raise first


def _ndim(grid, block):
    """How many of a launch's dimensions are in use (1, 2 or 3)."""
    return 3 if block.z > 1 or grid.z > 1 else 2 if block.y > 1 or grid.y > 1 else 1


def _target(frame):
    """The variable name on the kernel line that called cuda.shared.array (for labels)."""
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return line.split("=")[0].strip() if "=" in line else "shared"


class Trace:
    """The accesses of one traced launch, with pictures and a memory report."""

    def __init__(self, tracer, arrays):
        self.grid, self.block = tracer.grid, tracer.block
        self.events = sorted(tracer.events, key=lambda e: (e.block, e.thread, e.order))
        self.arrays = dict(arrays)                           # name -> numpy array (results)
        for arr in tracer.shared.values():
            self.arrays[arr.name] = arr.data
        self.shared_names = {arr.name for arr in tracer.shared.values()}
        self.out_of_bounds = list(tracer.errors)             # recorded by `sanitize`; `trace` raises instead
        self.source = tracer.source

    def source_line(self, line):
        """The text of one line of the kernel's source."""
        text = linecache.getline(self.source, line) if self.source and line else "?"
        return re.sub(r"\s+#.*$", "", text).strip()                 # without its comment

    def _block_label(self, block):
        gx, gy = self.grid.x, self.grid.y
        x, y, z = block % gx, block // gx % gy, block // (gx * gy)
        nd = _ndim(self.grid, self.block)
        return str(x) if nd == 1 else f"({x},{y})" if nd == 2 else f"({x},{y},{z})"

    def accesses(self, array=None, kind=None, block=None, thread=None):
        return [e for e in self.events if (array is None or e.array == array) and (kind is None or e.kind == kind)
                and (block is None or e.block == block) and (thread is None or e.thread == thread)]

    def _thread_label(self, thread):
        """A thread's coordinates in its block, as "x" or "x,y"."""
        bx, by = self.block.x, self.block.y
        x, y, z = thread % bx, thread // bx % by, thread // (bx * by)
        return str(x) if self.block.y == self.block.z == 1 else f"{x},{y}" if self.block.z == 1 else f"{x},{y},{z}"

    def draw(self, arrays=None, highlight=None, kinds=("read", "write"), title=None, color="block", label="id"):
        """One panel per (array, read/write): each cell coloured by the block that touched it
        and labelled with the thread(s) of that block. `highlight=(block, thread)` leaves
        out everything but that thread's accesses; `(block, range(32))`, all but that block's first
        warp; `(block, None)`, all but that block's.
        Blocks and threads are numbered linearly (x fastest). `label="xy"` writes a thread's
        (x, y) in its block instead; `color="phase"` colours by barrier phase instead of block
        (phase p = after the p-th `syncthreads`), which shows the steps of a loop of loads."""
        import matplotlib.pyplot as plt
        from matplotlib.collections import PatchCollection
        from matplotlib.patches import Rectangle

        names = [n for n in (arrays or self.arrays) if self.accesses(n)]
        panels = [(n, k) for n in names for k in kinds if self.accesses(n, k)]
        shapes = [self.arrays[n].shape if self.arrays[n].ndim == 2 else (1, self.arrays[n].size) for n, _ in panels]
        if all(self.arrays[n].ndim == 2 for n, _ in panels):        # matrices side by side
            widths = [c + 0.5 for _, c in shapes]
            cell = min(0.42, 7 / max(sum(widths), max(r for r, _ in shapes)))     # inches per cell
            fig, axes = plt.subplots(1, len(panels), squeeze=False, gridspec_kw={"width_ratios": widths},
                                     figsize=(cell * sum(widths) + 1, cell * max(r for r, _ in shapes) + 1.2))
            axes, width = axes[0], None
        else:                                                          # vectors one under another
            width = max(c for _, c in shapes)
            heights = [r + 1.2 for r, _ in shapes]
            cell = min(0.42, 14 / width)
            fig, axes = plt.subplots(len(panels), 1, squeeze=False, gridspec_kw={"height_ratios": heights},
                                     figsize=(cell * width + 1, cell * sum(heights) + 0.6))
            axes = axes[:, 0]
        colors = plt.get_cmap("tab10").colors
        for ax, (name, kind), (rows, cols) in zip(axes, panels, shapes):
            who = defaultdict(set)
            for e in self.accesses(name, kind):
                if highlight is None or (e.block == highlight[0] and (
                        highlight[1] is None or e.thread == highlight[1]
                        or (not np.isscalar(highlight[1]) and e.thread in highlight[1]))):
                    who[e.index if len(e.index) == 2 else (0, e.index[0])].add((e.block, e.thread, e.phase))
            cells = []
            for r in range(rows):
                for c in range(cols):
                    ts = who.get((r, c), set())
                    keys = sorted({b if color == "block" else p for b, _, p in ts})
                    face = colors[keys[0] % 10] if len(keys) == 1 else ("#555555" if keys else "#ffffff")
                    cells.append(Rectangle((c, rows - 1 - r), 1, 1, facecolor=face, alpha=0.45 if ts else 1,
                                           edgecolor="#444444", linewidth=0.6))
                    if ts:
                        tids = sorted({(b, t) for b, t, _ in ts})
                        text = (self._thread_label(tids[0][1]) if label == "xy" else str(tids[0][1])) \
                            if len(tids) == 1 else f"{len(tids)}×"
                        ax.text(c + 0.5, rows - 0.5 - r, text, ha="center", va="center", in_layout=False,
                                fontsize=(7 if cell > 0.3 else 5) - (1 if len(text) > 3 else 0))
            ax.add_collection(PatchCollection(cells, match_original=True))   # one artist: fast to draw
            ax.set_xlim(-0.05, (width or cols) + 0.05)
            ax.set_ylim(-0.05, rows + 0.05)
            ax.set_aspect("equal")
            ax.set_xticks([])
            ax.set_yticks([])
            for s in ax.spines.values():
                s.set_visible(False)
            ax.set_title(f"{name}: {kind}s", fontsize=9, loc="left")
        number = "(x,y) of the thread in its block" if label == "xy" else "thread in block"
        fig.suptitle(title or f"grid {tuple(self.grid)}, block {tuple(self.block)}\ncolour = {color}, "
                     f"number = {number}, n× = n threads", fontsize=9)
        fig.tight_layout()
        return fig

    def draw_steps(self, array, title=None):
        """A timeline of one (1-D) array, usually a block's shared memory: one row for the reads
        and one for the writes of each barrier phase (phase p = between the p-th and the
        (p+1)-th `syncthreads`), each cell labelled with the thread that touched it then.
        Shows a reduction's tree or a scan's steps."""
        import matplotlib.pyplot as plt
        from matplotlib.collections import PatchCollection
        from matplotlib.patches import Rectangle

        shape, n = self.arrays[array].shape, self.arrays[array].size
        rows = sorted({(e.phase, e.kind) for e in self.accesses(array)})      # "read" sorts before "write"
        who = defaultdict(set)
        for e in self.accesses(array):
            who[(rows.index((e.phase, e.kind)), int(np.ravel_multi_index(e.index, shape)))].add(e.thread)
        cell = min(0.42, 12 / n)
        fig, ax = plt.subplots(figsize=(cell * (n + 4) + 0.6, cell * len(rows) + 1.0))
        colors = plt.get_cmap("tab10").colors
        cells = []
        for r, (phase, kind) in enumerate(rows):
            y = len(rows) - 1 - r
            ax.text(-0.3, y + 0.5, f"phase {phase}, {kind}s", ha="right", va="center", fontsize=7)
            for c in range(n):
                ts = sorted(who.get((r, c), ()))
                cells.append(Rectangle((c, y), 1, 1, facecolor=colors[phase % 10] if ts else "#ffffff",
                                       alpha=0.45 if ts else 1, edgecolor="#444444", linewidth=0.6))
                if ts:
                    ax.text(c + 0.5, y + 0.5, str(ts[0]) if len(ts) == 1 else f"{len(ts)}×", in_layout=False,
                            ha="center", va="center", fontsize=7 if cell > 0.3 else 5)
        ax.add_collection(PatchCollection(cells, match_original=True))   # one artist: fast to draw
        ax.set_xlim(-4, n + 0.05)
        ax.set_ylim(-0.05, len(rows) + 0.05)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(title or f"{array}, one row per barrier phase and kind of access\n"
                     f"number = thread in block, n× = n threads", fontsize=9)
        fig.tight_layout()
        return fig

    def warp_report(self, warp=32, segment_bytes=128, banks=32):
        """For each array: the warp-wide accesses (the k-th access of every thread of a warp
        happens together), the average number of 128-byte memory segments each touches
        (1 = perfectly coalesced, for 4-byte data) and the worst shared-memory bank conflict
        (threads that hit different 4-byte words in the same bank are served one after another)."""
        groups = defaultdict(lambda: defaultdict(set))
        for e in self.events:
            a = self.arrays[e.array]
            flat = int(np.ravel_multi_index(e.index, a.shape))
            key = (e.array, e.kind, e.block, e.thread // warp, e.order)
            groups[e.array][key].add(flat)
        report = {}
        for name, accesses in groups.items():
            item = 4                                        # addresses as on a GPU with 4-byte words
            segs = [len({f * item // segment_bytes for f in addrs}) for addrs in accesses.values()]
            conflict = [max(np.bincount([f % banks for f in addrs], minlength=banks)) for addrs in accesses.values()]
            report[name] = {"warp accesses": len(segs), "segments per access": round(float(np.mean(segs)), 2),
                            "worst bank conflict": int(max(conflict))}
        return report


    # ---- warps, races and the profile of the launch ---------------------------------------------------
    def warp_accesses(self, warp=32):
        """{(array, kind, block, warp, line, n): {flat index: how many threads}}: the accesses each warp makes
        at once. The threads of a warp run one instruction at a time, so the n-th time each thread of the
        warp runs the access to an array on a source line is one warp-wide access; threads that skip it
        (behind an `if`) are not part of it."""
        groups = defaultdict(lambda: defaultdict(int))
        seen = defaultdict(int)
        strides = {name: np.array(a.strides) // a.itemsize for name, a in self.arrays.items()}
        for e in self.events:
            count = (e.block, e.thread, e.array, e.kind, e.line)
            n = seen[count]
            seen[count] = n + 1
            flat = int(sum(i * st for i, st in zip(e.index, strides[e.array])))
            groups[e.array, e.kind, e.block, e.thread // warp, e.line, n][flat] += 1
        return groups

    def races(self):
        """The hazards of the launch: two threads of one block that touch one address (shared or global) in
        the same barrier phase, at least one of them writing. Nothing orders them, so the read may see
        the value before or after the write (or one write may be lost). One Race per address: the first
        write, and the first access of another thread (a read if there is one)."""
        touched = defaultdict(list)
        for e in self.events:
            touched[e.block, e.array, e.index, e.phase].append(e)
        found = []
        for (block, array, index, phase), events in touched.items():
            write = next((e for e in events if e.kind == "write"), None)
            if write is None:
                continue
            others = [e for e in events if e.thread != write.thread]
            if others:
                other = next((e for e in others if e.kind == "read"), others[0])
                found.append(Race(array, index, block, phase, write, other))
        return sorted(found, key=lambda r: (r.block, r.first.order, r.array, r.index))

    def describe_race(self, race):
        """One race in words: the address, the two threads, what each did and on which line."""
        w, o = race.first, race.second
        verb = "reads" if o.kind == "read" else "writes"

        def thread(t):
            label = self._thread_label(t)
            return f"thread ({label})" if "," in label else f"thread {label}"

        return (f"{race.array}{list(race.index)} in block {self._block_label(race.block)}: {thread(w.thread)} writes "
                f"it at line {w.line} (`{self.source_line(w.line)}`) and {thread(o.thread)} {verb} it at line {o.line} "
                f"(`{self.source_line(o.line)}`), both after {race.phase} barrier(s): nothing orders them, so a "
                f"cuda.syncthreads() between the two is missing")

    def profile(self, multiply_adds=None, warp=32, banks=32, sector_bytes=32):
        """The launch's Profile: memory traffic, bank conflicts, uncoalesced accesses, out-of-bounds accesses
        and races. `multiply_adds` (say m * n * k for a matmul) turns the counts into rates."""
        p = Profile(tuple(self.grid), tuple(self.block), multiply_adds)
        for (array, kind, block, w, line, n), words in self.warp_accesses(warp).items():
            threads = sum(words.values())
            if array in self.shared_names:
                if kind == "read":
                    p.shared_loads += threads
                else:
                    p.shared_stores += threads
                ways = int(np.bincount([f % banks for f in words], minlength=banks).max())   # distinct words per bank
                p.wavefronts += ways
                p.shared_accesses += 1
                if ways > 1:
                    p.conflicts[(array, kind, line)] = max(ways, p.conflicts.get((array, kind, line), 0))
                continue
            item = self.arrays[array].itemsize
            sectors = len({f * item // sector_bytes for f in words})
            needed = -(-len(words) * item // sector_bytes)
            if kind == "read":
                p.global_loads += threads
            else:
                p.global_stores += threads
            p.sectors += sectors
            p.global_accesses += 1
            if sectors > 2 * needed:
                key = (array, kind, line)
                p.uncoalesced_count += 1
                worst = p.uncoalesced.get(key, (0, 0))
                p.uncoalesced[key] = max(worst, (sectors, needed))
        p.out_of_bounds = list(self.out_of_bounds)
        p.races = [self.describe_race(r) for r in self.races()]
        p.lines = {line: self.source_line(line) for _, _, line in (*p.conflicts, *p.uncoalesced)}
        return p


@dataclass
class Profile:
    """What one traced launch did with memory, and what went wrong: the course's Nsight and sanitizer.

    Counts are per element access of global arrays (the kernel's arguments) and shared arrays; a warp
    access is what the threads of one warp do at once (Trace.warp_accesses)."""
    grid: tuple
    block: tuple
    multiply_adds: int = None
    global_loads: int = 0
    global_stores: int = 0
    global_accesses: int = 0        # warp-wide
    sectors: int = 0                # 32-byte sectors moved by the global warp accesses
    shared_loads: int = 0
    shared_stores: int = 0
    shared_accesses: int = 0        # warp-wide
    wavefronts: int = 0             # the passes shared memory needs to serve them (1 each without conflict)
    conflicts: dict = field(default_factory=dict)        # (array, kind, line) -> worst ways
    uncoalesced: dict = field(default_factory=dict)      # (array, kind, line) -> (sectors, sectors needed)
    uncoalesced_count: int = 0
    out_of_bounds: list = field(default_factory=list)
    races: list = field(default_factory=list)
    lines: dict = field(default_factory=dict)            # line -> its source

    def per_multiply_add(self, count):
        return count / self.multiply_adds if self.multiply_adds else float("nan")

    @property
    def bank_conflicts(self):
        """Extra passes over shared memory caused by conflicts (0 when every warp access is conflict-free)."""
        return self.wavefronts - self.shared_accesses

    @property
    def worst_conflict(self):
        return max(self.conflicts.values(), default=1)

    def transactions_per_flop(self):
        """32-byte global transactions per floating-point operation (a multiply-add is two)."""
        return self.sectors / (2 * self.multiply_adds) if self.multiply_adds else float("nan")

    def __str__(self):
        threads = int(np.prod(self.grid)) * int(np.prod(self.block))
        lines = [f"launch: grid {self.grid}, block {self.block}: {threads} threads"]
        rate = (lambda c: f" ({self.per_multiply_add(c):.3g} per multiply-add)") if self.multiply_adds else (lambda c: "")
        lines.append(f"global memory: {self.global_loads} loads{rate(self.global_loads)}, {self.global_stores} stores, "
                     f"{self.sectors} 32-byte transactions"
                     + (f" ({self.transactions_per_flop():.3g} per flop)" if self.multiply_adds else ""))
        lines.append(f"shared memory: {self.shared_loads} loads{rate(self.shared_loads)}, {self.shared_stores} stores")
        if self.conflicts:
            (array, kind, line), ways = max(self.conflicts.items(), key=lambda kv: kv[1])
            lines.append(f"bank conflicts: {self.bank_conflicts} extra passes over {self.shared_accesses} warp accesses; "
                         f"worst {ways}-way, a {kind} of {array} at line {line} (`{self.lines[line]}`)")
        else:
            lines.append(f"bank conflicts: none in {self.shared_accesses} warp accesses")
        if self.uncoalesced:
            (array, kind, line), (got, need) = max(self.uncoalesced.items(), key=lambda kv: kv[1][0] / kv[1][1])
            lines.append(f"uncoalesced: {self.uncoalesced_count} of {self.global_accesses} warp accesses; worst a {kind} "
                         f"of {array} at line {line} (`{self.lines[line]}`): {got} transactions for {need} of data")
        else:
            lines.append(f"uncoalesced: none of {self.global_accesses} warp accesses")
        lines.append("out-of-bounds accesses: " + (f"{len(self.out_of_bounds)}, first: {self.out_of_bounds[0]}"
                                                   if self.out_of_bounds else "none"))
        lines.append("races: " + (f"{len(self.races)}, first: {self.races[0]}" if self.races else "none"))
        return "\n".join(lines)


def sanitize(kernel, grid, block, **arrays):
    """`trace`, with out-of-bounds accesses recorded in the Trace (and its profile) instead of raised:
    a thread that reads outside an array gets 0 and goes on, a write outside is dropped."""
    return trace(kernel, grid, block, _record_errors=True, **arrays)


def trace(kernel, grid, block, _record_errors=False, **arrays):
    """Run `kernel` in plain Python on copies of the named numpy arrays (keyword order =
    argument order; scalars pass through) and return the Trace. Results land in
    trace.arrays."""
    tracer = Tracer(grid, block, _record_errors)
    copies = {k: (np.array(v) if isinstance(v, np.ndarray) else v) for k, v in arrays.items()}
    args = [(_Array(v, k, tracer) if isinstance(v, np.ndarray) else v) for k, v in copies.items()]
    tracer.run(kernel, args)
    return Trace(tracer, {k: v for k, v in copies.items() if isinstance(v, np.ndarray)})


def rebind(kernel, **names):
    """The kernel's Python function with some of its module's names replaced (say TPB=8), to
    trace a library kernel at the sizes an exercise uses. `trace` accepts it like a kernel."""
    fn = getattr(kernel, "py_func", kernel)
    return types.FunctionType(fn.__code__, {**fn.__globals__, **names}, fn.__name__, fn.__defaults__,
                              fn.__closure__)
