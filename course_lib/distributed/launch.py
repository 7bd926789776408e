"""Start a group of worker processes, collect what each returns, and never leave one behind.

    results = launch(timing.time_collectives, 3, {"gloo": dist.all_reduce}, [64, 4096])   # one result per rank

Each worker is a fresh Python process. On Linux it is forked from a *fork server*: a clean process,
started once per notebook (or test run), that has already imported torch. Importing torch takes
seconds, forking takes milliseconds, so the second launch starts in a fraction of a second. (A fork
of the notebook itself would inherit its threads and, on a GPU, its CUDA context; the server has
neither.) Elsewhere (macOS, Windows) each worker is spawned: a fresh interpreter, slower to start.
Either way the worker finds the function to run by its module and name, so it must live in an
importable file: a function typed into a notebook cannot be found that way, and `Code.of(fn)`
carries its source over instead (`carry(obj)` picks what fits). The server keeps the modules it
preloaded as they were when it started: after editing course_lib, restart the kernel. A worker's
prints and warnings go where the notebook's own low-level output goes (under Jupyter, the cell).

Why the care:
- the rendezvous (a small key-value store where the workers exchange addresses) is served by the
  parent on a port the OS picks from the free range (bind to port 0), so two runs at once, two
  notebooks or two test files, never meet on the same one, and no other program can take the port
  between choosing it and using it;
- every wait has a deadline: `init_process_group(timeout=...)` bounds the rendezvous and, on gloo, every
  collective, so a rank that never arrives becomes an error instead of a hang;
- a supervisor: if one worker raises or dies (killed, out of memory), the others may be blocked in a
  collective that can never complete. It stops them all and raises one `WorkerError` naming the rank
  that failed first and its error, with that rank's traceback.
"""

import datetime
import importlib.machinery
import os
import pickle
import queue as queue_module
import signal
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from course_lib.learner.capture import defined_here, module_source

# the fork server imports these once; every worker forked from it starts with them loaded (torch._dynamo
# is imported by the first optimizer a process makes, and takes longer than torch itself)
PRELOAD = ["torch", "torch.distributed", "torch.nn", "torch.optim", "torch._dynamo", "numpy",
           "course_lib.distributed.launch"]


class WorkerError(RuntimeError):
    """A worker raised or died. `rank` is the rank that failed first; `error` its one-line error."""

    def __init__(self, rank, error, details="", others=(), running=()):
        self.rank, self.error, self.others, self.running = rank, error, dict(others), list(running)
        then = "".join(f"\n  then rank {r} failed: {_short(e)}" for r, e in self.others.items())
        if self.running:   # a rank that hangs shows up here, after the others' timeouts
            then += f"\n  still running: rank {', '.join(map(str, self.running))}"
        super().__init__(f"rank {rank} failed: {error}{then}\n  (every worker has been stopped)"
                         + (f"\n\n--- rank {rank} ---\n{details}" if details else ""))


def _short(text, width=160):
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= width else line[:width - 3] + "..."


class Code:
    """A function or class carried to the workers as source text, for code they cannot import by name.

    `Code.of(fn)` takes a notebook function with the helpers and imports it needs; `Code(text, name)`
    takes the text of a module and the name to call in it. The worker runs the text, then the name.
    """

    def __init__(self, text, name, filename=None):
        self.text, self.name, self.filename = text, name, filename or f"<{name}>"

    @classmethod
    def of(cls, obj, namespace=None):
        return cls(module_source([obj], namespace), obj.__name__)

    def load(self):
        scope = {"__name__": f"course_code_{self.name}"}
        exec(compile(self.text, self.filename, "exec"), scope)
        return scope[self.name]


def carry(obj):
    """What reaches the workers for obj: itself if they can import it by name; else its source as a `Code`.

    A notebook's function or class travels as its source with its helpers; one from a module loaded
    from a file outside the import path (your saved work/yours/chNN.py) travels as that whole file.
    """
    if isinstance(obj, Code):
        return obj
    if defined_here(obj) is not None:
        return Code.of(obj)
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    path = getattr(module, "__file__", None)
    if path and importlib.machinery.PathFinder.find_spec(module.__name__.partition(".")[0]) is None:
        with open(path, encoding="utf-8") as f:
            return Code(f.read(), obj.__name__, path)
    return obj


def resolve(obj):
    """obj itself, or what a Code stands for (called inside the workers)."""
    return obj.load() if isinstance(obj, Code) else obj


def run_all(cases):
    """Several jobs in one launch, one after the other: [(fn or Code, kwargs)] -> their results."""
    return [resolve(fn)(**kwargs) for fn, kwargs in cases]


def preload(*modules):
    """Have the fork server import `modules` too, so that workers start with them loaded (the modules their
    jobs live in: a worker that imports them itself, under load, may reach a collective seconds after the
    others). Effective until the first launch of this process starts the server."""
    PRELOAD.extend(m for m in modules if m not in PRELOAD)


def _context():
    """Fork from a server that preloaded torch where that is safe (Linux); spawn a fresh interpreter elsewhere."""
    if sys.platform.startswith("linux"):
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)   # read when the server starts: the first launch of this process
        return ctx
    return mp.get_context("spawn")


def device():
    """Where this worker's tensors live: its own GPU under NCCL, the CPU under gloo."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _worker(rank, world_size, port, backend, timeout, threads, fn, args, results):
    """The body of each process: join the group, run fn(*args), report (rank, ok, payload)."""
    torch.set_num_threads(threads)   # the ranks share the machine's cores; one thread each avoids oversubscription
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        wait = datetime.timedelta(seconds=timeout)
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=wait)   # the parent's
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=wait)
        out = resolve(fn)(*args)
        results.put((rank, True, pickle.dumps(out)))   # plain pickle: tensors are copied, not shared
    except BaseException as e:
        results.put((rank, False, (f"{type(e).__name__}: {e}", traceback.format_exc())))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _death(exitcode):
    if exitcode is not None and exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode} without returning a result"


def launch(fn, world_size, *args, backend="gloo", timeout=60.0, threads=1, wall_timeout=None):
    """Run fn(*args) on `world_size` new processes joined in one process group; return their results by rank.

    fn: an importable function (or a `Code`); inside it, dist.get_rank() tells the worker who it is.
    timeout: seconds that the rendezvous and each collective may wait.
    wall_timeout: seconds for the whole run (None: no limit beyond the collectives' timeouts).
    Raises WorkerError when a worker raises or dies; all the workers have ended by the time it returns.
    """
    ctx = _context()
    results = ctx.Queue()
    # the rendezvous: a key-value store served by this process on a port the OS picks (port 0), so it
    # cannot be taken between choosing it and using it; the workers meet there to exchange addresses
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, timeout=datetime.timedelta(seconds=timeout),
                          wait_for_workers=False)
    port = store.port
    procs = [ctx.Process(target=_worker, daemon=True,
                         args=(r, world_size, port, backend, timeout, threads, fn, args, results))
             for r in range(world_size)]
    done, failed = {}, {}   # rank -> result; rank -> (error, traceback), in the order seen
    deadline = None if wall_timeout is None else time.monotonic() + wall_timeout

    def collect(wait):
        try:
            rank, ok, payload = results.get(timeout=wait)
        except queue_module.Empty:
            return False
        if ok:
            done[rank] = pickle.loads(payload)
        else:
            failed.setdefault(rank, payload)
        return True

    def check_deaths():
        for r, p in enumerate(procs):
            if r not in done and r not in failed and p.exitcode is not None:
                while collect(0.05):   # its last message may still be in the pipe
                    pass
                if r not in done and r not in failed:
                    failed[r] = (_death(p.exitcode), "")

    try:
        for p in procs:
            p.start()
        while len(done) < world_size and not failed:
            if not collect(0.05):
                check_deaths()
            if deadline is not None and time.monotonic() > deadline and not failed:
                failed[min(set(range(world_size)) - set(done))] = (f"still running after {wall_timeout} s", "")
        if failed:
            end = time.monotonic() + 0.5   # a moment for the other failures to arrive, to find the first cause
            while time.monotonic() < end and len(done) + len(failed) < world_size:
                if not collect(0.05):
                    check_deaths()
    finally:
        running = [r for r, p in enumerate(procs) if p.is_alive() and r not in done and r not in failed]
        _stop(procs)
        results.close()
        results.cancel_join_thread()
        del store
    if failed:
        # a killed rank is the cause; the others' errors ("connection closed by peer") are its consequences
        killed = [r for r in failed if failed[r][0].startswith("killed by")]
        first = killed[0] if killed else next(iter(failed))
        error, details = failed[first]
        raise WorkerError(first, error, details, {r: e for r, (e, _) in failed.items() if r != first}, running)
    return [done[r] for r in range(world_size)]


def _stop(procs):
    """Terminate (SIGTERM), then kill (SIGKILL) whatever is still alive, and reap every process."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        if p.pid is None:   # never started
            continue
        p.join(timeout=3)
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join()
