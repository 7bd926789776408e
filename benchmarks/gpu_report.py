"""What gpu_verify.py records, shared by the runner and by every file of cases: no import loop.

    from gpu_report import Check, Skip, case, figure

    @case("attention", "fused fwd causal")          # a correctness case: fn(env) -> Check, or raise Skip
    def _(env):
        ...
        return Check(err, bound, "B=2, H=3, T=333")

    @figure("attention", "Fused attention against SDPA", ["T", "ours ms", "SDPA ms"])
    def _(env, fig):                                 # a figure: yields table rows (fig.notes, fig.skipped)
        yield [1024, "0.51", "0.20"]

The decorators append to CASES and FIGURES, in the order the files are imported; gpu_verify.py imports
gpu_cases.py (chapters 07 and 08, the launch limits, NCCL), which imports the other files of cases
(gpu_cases_ch10.py and any later one). This module imports nothing of the course, so a file of cases
and the runner can both import it.
"""

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

CASES = []     # (group, name, fn): fn(env) returns a Check or raises Skip
FIGURES = []   # (group, title, header, fn): fn(env, figure) yields table rows


def case(group, name):
    """Register a correctness case of `group` (one of gpu_verify's --only groups)."""
    def register(fn):
        CASES.append((group, name, fn))
        return fn
    return register


def figure(group, title, header):
    """Register a figure: a table with `header`, filled row by row by fn(env, figure)."""
    def register(fn):
        FIGURES.append((group, title, header, fn))
        return fn
    return register


class Skip(Exception):
    """A case that cannot run here; the message says why (never skipped silently)."""


@dataclass
class Check:
    """A correctness case's outcome: the largest error, the bound it must stay under, a note."""
    err: float = 0.0
    bound: float = 0.0
    note: str = ""
    status: str = ""          # "" means decided by err <= bound; "INFO" for a fact that is neither

    def decide(self):
        if self.status:
            return self.status
        return "PASS" if self.err <= self.bound else "FAIL"   # a nan error fails too


@dataclass
class Result:
    group: str
    name: str
    status: str               # PASS, FAIL, SKIP or INFO
    err: float = None
    bound: float = None
    note: str = ""
    seconds: float = 0.0


@dataclass
class Figure:
    """A table filled row by row; `skipped` lists what the time budget left out."""
    group: str
    title: str
    header: list
    rows: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    skipped: list = field(default_factory=list)

    def markdown(self):
        lines = [f"### {self.title}", "", "| " + " | ".join(self.header) + " |",
                 "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in self.rows]
        lines += [""] + [f"{n}" for n in self.notes]
        if self.skipped:
            lines += ["", "Skipped (time budget spent): " + ", ".join(self.skipped) + "."]
        return "\n".join(lines) + "\n"


class Budget:
    """Seconds left for figures; the correctness cases always run."""

    def __init__(self, seconds):
        self.start, self.seconds = time.monotonic(), seconds

    def spent(self):
        return self.seconds is not None and time.monotonic() - self.start > self.seconds


class Report:
    """The markdown report, rewritten whole after every case so a cut-off run leaves a valid file."""

    def __init__(self, path, facts):
        self.path, self.facts = Path(path), facts
        self.results, self.figures = [], []

    def counts(self):
        return {s: sum(r.status == s for r in self.results) for s in ("PASS", "FAIL", "SKIP", "INFO")}

    def write(self, finished=False):
        c = self.counts()
        lines = ["# The course's CUDA code on a real device", "",
                 f"Written by `benchmarks/gpu_verify.py` on {self.facts['date']}"
                 + ("." if finished else " (still running or cut off: the cases below are those done)."), ""]
        lines += [f"- **{k}:** {v}" for k, v in self.facts.items() if k != "date"]
        lines += ["", "## Correctness", "",
                  "float32 inputs (the chapter 07 scan float64) of sizes that are not multiples of a block, "
                  "against PyTorch in float64 on the device named above (the CPU when torch has no CUDA).", "",
                  "| group | case | result | max error | bound | note |", "|---|---|---|---|---|---|"]
        for r in self.results:
            lines.append(f"| {r.group} | {r.name} | {r.status} | {_num(r.err)} | {_num(r.bound)} | "
                         f"{r.note.replace('|', '/')} |")
        lines += ["", f"**{c['PASS']} passed, {c['FAIL']} failed, {c['SKIP']} skipped, {c['INFO']} facts.**", "",
                  "## Figures", ""]
        lines += [f.markdown() for f in self.figures] or ["(none yet)"]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("\n".join(lines) + "\n")


def _num(x):
    return "" if x is None else f"{x:.1e}"


def say(text):
    print(text, flush=True)


def last_line(exc):
    """The last line of an exception's traceback: its type and message."""
    lines = traceback.format_exception_only(type(exc), exc)
    text = lines[-1].strip() if lines else repr(exc)
    return text.splitlines()[0][:300]


