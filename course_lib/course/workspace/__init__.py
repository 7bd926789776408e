"""The learner's workspace, work/: their own copies of the notebooks, never tracked by git.

    work/notebooks/NN_topic.ipynb   copies of the lessons
    work/exercises/NN_topic.ipynb   copies of the exercises, to fill in
    work/backups/                   every copy that `course reset` or a merge replaced, timestamped
    work/course_lib/, benchmarks/   read-only copies of the library's source and the benchmarks, to read
    work/yours/chNN.py              the learner's passing code (see course_lib.learner.answers)
    work/.sync.json                 which course version each copy came from
    work/.progress.json             the last result of every check (course_lib.learner.progress)
    work/.jupyter/                  the signatures that make JupyterLab trust the copies

`git pull` only touches the course's own folders, so it never conflicts with work/. One concern a file:

    copies.py   the copies: where a chapter's notebook is, reading one (or saying why it cannot be
                read), backing one up, signing it for JupyterLab, and what sync remembers of each
    sync.py     `course sync`: new notebooks in, the course's updates merged into the learner's copies
    mirror.py   the read-only copies of course_lib/ and benchmarks/ that JupyterLab shows
    stage.py    a workspace whose exercises are the solved ones, for the tests
    reset.py    `course reset NN`: a fresh copy, after backing the old one up
"""
