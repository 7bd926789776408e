"""Exercise generation and the notebook conventions."""

import nbformat

from course_lib.course import exercises, nbtools

SCRIPT = '''# %% [markdown]
# Write `square`. *About 1 line.*

# %%
def square(x):
    """Return x squared."""
    ### BEGIN SOLUTION
    return x * x
    ### END SOLUTION

# %% tags=["check"]
check.square(square)
'''


def test_from_script_makes_cells_with_tags():
    nb = nbtools.from_script(SCRIPT)
    assert [c.cell_type for c in nb.cells] == ["markdown", "code", "code"]
    assert nb.cells[2].metadata["tags"] == ["check"]
    assert nb.cells[0].source == "Write `square`. *About 1 line.*"
    nbformat.validate(nb)


def test_make_exercise_stubs_regions_and_clears_outputs():
    nb = nbtools.from_script(SCRIPT)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="hi")]
    nb.cells[1].execution_count = 3
    ex = exercises.make_exercise(nb)
    src = ex.cells[1].source
    assert "x * x" not in src and exercises.BEGIN not in src
    assert "    # YOUR CODE HERE\n    raise NotImplementedError(" in src
    assert src.startswith('def square(x):\n    """Return x squared."""\n')
    assert ex.cells[1].outputs == [] and ex.cells[1].execution_count is None
    assert nb.cells[1].outputs, "the solution notebook itself must not change"
    assert ex.cells[0] == nb.cells[0] and ex.cells[2].source == nb.cells[2].source


def test_make_exercise_handles_several_regions_and_top_level_code():
    nb = nbtools.from_script("# %%\n### BEGIN SOLUTION\na = 1\n### END SOLUTION\nb = 2\n"
                             "for i in range(3):\n    ### BEGIN SOLUTION\n    a += i\n    ### END SOLUTION\n")
    src = exercises.make_exercise(nb).cells[0].source
    assert src.count("raise NotImplementedError") == 2
    assert "b = 2" in src and "a = 1" not in src and "a += i" not in src


def test_exercise_text_is_stable():
    nb = nbtools.from_script(SCRIPT)
    assert nbtools.dumps(exercises.make_exercise(nb)) == nbtools.dumps(exercises.make_exercise(nb))


def test_lint_finds_missing_size_and_missing_check():
    nb = nbtools.from_script(SCRIPT)
    assert exercises.lint(nb) == []
    nb.cells[0].source = "Write `square`."
    assert any("rough size" in p for p in exercises.lint(nb))
    nb.cells[2].metadata["tags"] = []
    assert any("tagged 'check'" in p for p in exercises.lint(nb))


def test_check_names():
    assert exercises.check_names(nbtools.from_script(SCRIPT)) == ["square"]


def test_every_lesson_is_titled_like_the_others():
    """The book's sidebar lists the lessons by their titles: "NN · Topic" for every chapter."""
    from course_lib import REPO_DIR

    for path in sorted((REPO_DIR / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert exercises.lint_lesson(nbtools.read(path), path.name) == [], path.name
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Chapter 07: GPU programming")])
    assert "the title must read \"# 07 · Topic\"" in exercises.lint_lesson(nb, "07_cuda.ipynb")[0]
    nb.cells[0].source = "# 08 · GPU programming"
    assert exercises.lint_lesson(nb, "07_cuda.ipynb"), "the number must be the chapter's"
