"""The course's tooling: the `course` command and everything it runs, kept apart from the teaching code.

    commands.py      `course` itself: each subcommand, and the one line that answers bad input
    printing.py      what the commands print: wrapped to the terminal, in colour only on a terminal
    running.py       running a notebook headless: `course check`'s report, `course execute`
    environment.py   the one-time setup: the Jupyter kernel, JupyterLab's settings, Graphviz
    lab.py           `course lab`: the JupyterLab server, its terminal (shell/), the URL that logs in
    workspace/       work/, the learner's copies of the notebooks: sync, mirror, stage, reset
    nbtools.py       notebook plumbing: read, write, execute, write one from a script
    exercises.py     exercise notebooks made from solutions/, and the notebooks' conventions
    links.py         each notebook's Colab and Binder links and Colab cell, and the README's badges
    colab.py         what a notebook's first cell sets up in Google Colab (colab_versions.toml)
    about.py         chapter 00's report: the versions, and where CUDA kernels run
    resources.py     the files lessons read besides the library (benchmarks/), wherever they run

The learner's record (which checks passed, the code they kept), which the checks write and
`course_lib.yours` reads inside the notebooks, is `course_lib.learner`.
"""

import time

STARTED = time.monotonic()
"""When this process started to load the tooling: `course check` counts its time from here, so that
Python's and the libraries' start-up are in the figure the learner reads."""


class CourseError(Exception):
    """A problem the learner can fix: its message says what is wrong and what to do, in one line.
    `course` prints it, and nothing is lost."""
