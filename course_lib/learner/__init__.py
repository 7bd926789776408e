"""The course's record of the learner, apart from the chapters' code: what the checks write, inside
the learner's notebooks, and what `course_lib.yours` and `course status` read.

    progress.py   which checks passed (work/.progress.json), and where the workspace is
    answers.py    the code of each passing check, kept in work/yours/chNN.py for later chapters
    capture.py    how that code is found: the source of a function and of the names it uses

The workspace's copies of the notebooks, and the commands that keep them (`course sync`, `course
reset`), are the course's tooling: `course_lib.course.workspace`.
"""
