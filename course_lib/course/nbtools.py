"""Notebook plumbing with nbformat and nbclient: read, write, execute, and author from text.

Authoring format for `from_script` (the "percent" format): cells are separated by lines
starting with `# %%`. `# %% [markdown]` starts a markdown cell whose lines are comments
(`# text`). Tags go in brackets at the end: `# %% tags=["check", "nbval-ignore-output"]`.
"""

import json
import os
import re
from pathlib import Path

import nbformat
import zmq
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

# The kernel `course setup` registers (environment.install_kernel): the notebooks carry its own name, so that
# JupyterLab has nothing to rewrite when a learner opens one.
KERNEL = {"name": "python3", "display_name": "Python 3 (course)", "language": "python"}


def read(path):
    return nbformat.read(str(path), as_version=4)


def dumps(nb):
    """The notebook as text, byte-for-byte stable for the same content."""
    return nbformat.writes(nb) + "\n"


def write(nb, path):
    nbformat.validate(nb)
    Path(path).write_text(dumps(nb), encoding="utf-8")


def run_cells(nb, cwd, timeout=600, allow_errors=False, kernel_name="python3", skip=None):
    """Run the notebook's code cells one by one in a fresh kernel started in `cwd`, yielding each
    (index, cell) once it has run, so a caller can report progress or stop early.

    skip(cell) -> True leaves a cell unrun (its old outputs are cleared). The kernel talks over
    Jupyter's default transport, TCP on 127.0.0.1, as JupyterLab's kernels do (see
    `course_lib.course.lab.kernel_settings`), encrypted where ZeroMQ has CurveZMQ.
    """
    km = KernelManager(kernel_name=kernel_name)
    if zmq.has("curve"):
        km.transport_encryption = "auto"
    client = NotebookClient(nb, km=km, timeout=timeout, kernel_name=kernel_name, allow_errors=allow_errors,
                            resources={"metadata": {"path": str(cwd)}})
    try:
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                if skip is not None and skip(cell):
                    cell.outputs, cell.execution_count = [], None
                    continue
                client.execute_cell(cell, index)
                yield index, cell
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=True)


def execute(nb, cwd, timeout=600, allow_errors=False, kernel_name="python3"):
    """Run every cell in a fresh kernel started in `cwd`; returns the executed notebook."""
    for _ in run_cells(nb, cwd, timeout=timeout, allow_errors=allow_errors, kernel_name=kernel_name):
        pass
    return nb


def clean_metadata(nb):
    """Drop per-run metadata (timings, widget state) so re-running changes only outputs, and the folder
    of the machine that ran it from the outputs (a traceback shows course_lib/tensor/tensor.py)."""
    nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = dict(KERNEL)
    nb.metadata.setdefault("language_info", {"name": "python"})
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("collapsed", None)
        cell.metadata.pop("scrolled", None)
        for output in cell.get("outputs", []):
            _relative_paths(output)
    return nb


def _relative_paths(output):
    """Paths inside the checkout made relative to it, in an output's text and traceback."""
    from course_lib import REPO_DIR

    def fix(text):
        return text.replace(f"{REPO_DIR}{os.sep}", "")

    if "text" in output:
        output["text"] = fix(output["text"])
    if "traceback" in output:
        output["traceback"] = [fix(line) for line in output["traceback"]]
    if "text/plain" in output.get("data", {}):
        output["data"]["text/plain"] = fix(output["data"]["text/plain"])


def from_script(text):
    """Build a notebook from the percent format described in the module docstring."""
    nb = nbformat.v4.new_notebook()
    chunks = re.split(r"^# %%", text, flags=re.M)
    for chunk in chunks[1:]:
        header, _, body = chunk.partition("\n")
        tags = json.loads(m.group(1)) if (m := re.search(r"tags=(\[.*\])", header)) else []
        body = body.strip("\n")
        if "[markdown]" in header:
            body = "\n".join(re.sub(r"^# ?", "", line) for line in body.splitlines())
            cell = nbformat.v4.new_markdown_cell(body)
        else:
            cell = nbformat.v4.new_code_cell(body)
        if tags:
            cell.metadata["tags"] = tags
        nb.cells.append(cell)
    return clean_metadata(nb)
