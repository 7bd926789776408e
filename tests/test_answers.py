"""learner/answers.USED_BY, the chapters whose closing cells run a chapter's saved code (a pass line names
them), is what the closing cells and the yours/ assemblies they call actually read.

Read from the sources: the "payoff" cells of solutions/NN import modules of course_lib.yours; a yours
module reads chapter MM's saved pieces in a call whose first argument is the string "MM"
(`yours.pieces("02", ...)`, `backends.build("06", ...)`), and brings in the yours modules it imports.
"""

import ast
import re

from course_lib import REPO_DIR
from course_lib.course import nbtools
from course_lib.learner import answers

YOURS = REPO_DIR / "course_lib" / "yours"


def yours_modules_imported(tree):
    """The course_lib.yours modules a piece of code imports, by name."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "course_lib.yours":
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_lib.yours."):
            names.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            names.update(a.name.split(".")[2] for a in node.names if a.name.startswith("course_lib.yours."))
    return {n for n in names if (YOURS / f"{n}.py").exists()}


def chapters_read(module, seen=None):
    """The chapters whose saved pieces a yours module reads, itself or through the yours modules it imports."""
    seen = set() if seen is None else seen
    if module in seen:
        return set()
    seen.add(module)
    tree = ast.parse((YOURS / f"{module}.py").read_text())
    first = [node.args[0].value for node in ast.walk(tree)
             if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)]
    found = {arg for arg in first if isinstance(arg, str) and re.fullmatch(r"\d\d", arg)}
    for other in yours_modules_imported(tree):
        found |= chapters_read(other, seen)
    return found


def used_by_from_the_sources():
    used = {}
    for path in sorted((REPO_DIR / "solutions").glob("[0-9][0-9]_*.ipynb")):
        cells = [c.source for c in nbtools.read(path).cells if c.cell_type == "code" and "payoff" in c.metadata.get("tags", [])]
        code = [line for cell in cells for line in cell.splitlines() if not line.lstrip().startswith(("%", "!"))]
        tree = ast.parse("\n".join(code))
        for module in yours_modules_imported(tree):
            for chapter in chapters_read(module):
                used.setdefault(chapter, set()).add(path.name[:2])
    return {chapter: sorted(chapters) for chapter, chapters in sorted(used.items())}


def test_used_by_is_what_the_closing_cells_run():
    derived = used_by_from_the_sources()
    assert derived == answers.USED_BY, (
        f"learner/answers.USED_BY says {answers.USED_BY}, but the closing cells of solutions/ run {derived} "
        "(chapter: the chapters whose closing cells read its saved pieces)")


def test_the_pass_line_names_them():
    assert answers.used_by("06") == ", which the closing cells of chapters 06, 12 and 13 run"
    assert answers.used_by("07") == ", which chapter 07's closing cells run"
    assert answers.used_by("03") == ""


def test_the_readme_names_every_exercise_notebook_whose_closing_cells_run_saved_pieces():
    readme = " ".join((REPO_DIR / "README.md").read_text().split())
    listed = re.search(r"The closing cells of exercise notebooks ([\d, and]+) run on those saved pieces", readme)
    assert listed, "README.md no longer says which exercise notebooks' closing cells run the saved pieces"
    with_payoff = sorted({chapter for chapters in answers.USED_BY.values() for chapter in chapters})
    assert re.findall(r"\d\d", listed.group(1)) == with_payoff
