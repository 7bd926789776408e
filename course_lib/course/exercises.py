"""Make exercise notebooks from solution notebooks, and check the course's conventions.

In solutions/NN_topic.ipynb the reference answer of each exercise sits between

    ### BEGIN SOLUTION
    ...
    ### END SOLUTION

`make_exercise` replaces each such region by `# YOUR CODE HERE` and a
`raise NotImplementedError`, clears all outputs, and leaves everything else as it is.
"""

import re

import nbformat

from course_lib import REPO_DIR
from course_lib.course import nbtools

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
_REGION = re.compile(r"^([ \t]*)### BEGIN SOLUTION[^\n]*\n.*?^[ \t]*### END SOLUTION[^\n]*(\n|$)", re.M | re.S)
CHECK_CALL = re.compile(r"\bcheck\.(\w+)\(")
SIZE = re.compile(r"\babout \d+(-\d+)? lines?\b", re.I)
TITLE = re.compile(r"# (\d\d) · \S")


def stub(match):
    indent = match.group(1)
    return (f"{indent}# YOUR CODE HERE\n"
            f"{indent}raise NotImplementedError(\"Exercise: replace this line with your code\")"
            + match.group(2))


def make_exercise(solution_nb):
    nb = nbformat.from_dict(solution_nb)  # a deep copy
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = _REGION.sub(stub, cell.source)
            cell.outputs = []
            cell.execution_count = None
    return nbtools.clean_metadata(nb)


def pairs(repo=REPO_DIR):
    """(solution path, exercise path) for every chapter."""
    return [(s, repo / "exercises" / s.name) for s in sorted((repo / "solutions").glob("[0-9][0-9]_*.ipynb"))]


def build(check_only=False, repo=REPO_DIR):
    """Write exercises/ from solutions/. With check_only, write nothing; return stale paths."""
    stale = []
    for sol, ex in pairs(repo):
        text = nbtools.dumps(make_exercise(nbtools.read(sol)))
        if not ex.exists() or ex.read_text(encoding="utf-8") != text:
            stale.append(ex)
            if not check_only:
                ex.write_text(text, encoding="utf-8")
    return stale


def is_exercise(cell):
    """A solution cell (with markers) or its generated stub."""
    return cell.cell_type == "code" and (BEGIN in cell.source or "# YOUR CODE HERE" in cell.source)


def is_check(cell):
    return cell.cell_type == "code" and "check" in cell.metadata.get("tags", [])


def check_names(nb):
    """The exercise checks a notebook calls, in order."""
    return [m for c in nb.cells if is_check(c) for m in CHECK_CALL.findall(c.source)]


def lint(nb):
    """Problems with a solution notebook's conventions, as a list of sentences."""
    problems = []
    cells = nb.cells
    for i, cell in enumerate(cells):
        if cell.cell_type != "code":
            continue
        if cell.source.count(BEGIN) != cell.source.count(END):
            problems.append(f"cell {i}: unbalanced solution markers")
        if is_exercise(cell):
            before = cells[i - 1].source if i and cells[i - 1].cell_type == "markdown" else ""
            if not SIZE.search(before + cell.source):
                problems.append(f"cell {i}: an exercise must state its rough size (\"about 5 lines\")")
            nxt = cells[i + 1] if i + 1 < len(cells) else None
            if nxt is None or not is_check(nxt):
                problems.append(f"cell {i}: an exercise must be followed by a cell tagged 'check'")
        if is_check(cell) and not CHECK_CALL.search(cell.source):
            problems.append(f"cell {i}: a check cell must call check.<name>(...)")
    return problems


def lint_lesson(nb, name):
    """Problems with a lesson's conventions: its first line is its title, "# NN · Topic", the way the
    book's sidebar and JupyterLab's table of contents list the chapters (the welcome lesson, 00, has
    the course's own title)."""
    first = nb.cells[0].source.strip().splitlines()[0] if nb.cells and nb.cells[0].source.strip() else ""
    if name.startswith("00_") or ((m := TITLE.match(first)) and m.group(1) == name[:2]):
        return []
    return [f"the title must read \"# {name[:2]} · Topic\", as the other chapters' do; it reads {first!r}"]
