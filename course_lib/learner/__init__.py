"""The course's record of the learner, apart from the chapters' code.

    progress.py   which checks passed (work/progress.json), and where the workspace is
    answers.py    the code of each passing check, kept in work/yours/chNN.py for later chapters
    capture.py    how that code is found: the source of a function and of the names it uses
    workspace.py  work/, the learner's copies of the notebooks, and `course sync` after an update
"""
