"""The teaching bar: no lesson shows an exercise's answer, and every exercise has hints.

An answer is the significant lines of a solution region: stripped, without comments, blank
lines or trivial lines such as `return out`. A lesson shows it when it holds any 3 consecutive
significant lines of it, or the whole of an answer of 1-2 lines, in its code, its prose or its
printed output. Lessons are searched up to the exercise's own chapter.

Every exercise's markdown (the cell right above the solution cell) carries a collapsible
`<details>` hint that names the lesson to look at; exercises of more than 5 significant lines
get two. A hint never quotes a line of the answer.
"""

import re
from dataclasses import dataclass

import pytest

from course_lib import REPO_DIR, build, nbtools

TRIVIAL = re.compile(r"^(return\s*\w*|pass|else:|try:|break|continue|[)\]}]+|out\s*=\s*\[\]|.{0,12})$")
DETAILS = re.compile(r"<details>\s*<summary>(.*?)</summary>(.*?)</details>", re.S | re.I)
REGION = re.compile(r"### BEGIN SOLUTION[^\n]*\n(.*?)^[ \t]*### END SOLUTION", re.S | re.M)


def normalize(line, code=True):
    """One line as compared: comment dropped (code), whitespace folded, backticks stripped."""
    if code:
        line = "" if line.strip().startswith("#") else re.split(r"\s#(?:\s|$)", line, maxsplit=1)[0]
    return re.sub(r"\s+", " ", line).strip().strip("`").strip()


def significant(text):
    lines = (normalize(line) for line in text.splitlines())
    return [s for s in lines if s and not TRIVIAL.match(s)]


@dataclass
class Exercise:
    notebook: str
    cell: int
    answer: list        # significant lines
    hint_text: str      # the markdown cell right above, where the hints live
    hints: list         # (summary, body) of each <details> block


def exercises():
    found = []
    for sol, _ in build.pairs():
        cells = nbtools.read(sol).cells
        for i, cell in enumerate(cells):
            if cell.cell_type != "code" or build.BEGIN not in cell.source:
                continue
            md = cells[i - 1].source if i and cells[i - 1].cell_type == "markdown" else ""
            answer = [s for m in REGION.finditer(cell.source) for s in significant(m.group(1))]
            found.append(Exercise(sol.name, i, answer, md, DETAILS.findall(md)))
    return found


def lesson_lines(path):
    """(cell index, normalized line) for every line of a lesson: code, prose and printed output."""
    out = []
    for i, cell in enumerate(nbtools.read(path).cells):
        code = cell.cell_type == "code"
        texts = [cell.source]
        for o in cell.get("outputs", []) if code else []:
            texts.append(o.get("text", "") or o.get("data", {}).get("text/plain", ""))
            texts.append(o.get("data", {}).get("text/markdown", ""))
        for k, text in enumerate(texts):
            for line in text.splitlines():
                s = normalize(line, code=code and k == 0)
                if s:
                    out.append((i, s))
    return out


LESSONS = {p.name[:2]: (p.name, lesson_lines(p)) for p in sorted((REPO_DIR / "notebooks").glob("[0-9][0-9]_*.ipynb"))}
EXERCISES = exercises()


def shown_in(answer, lines):
    """The lesson cell where the answer is shown, or None."""
    k = min(3, len(answer))
    if k == 0 or (k < 3 and not all(len(s) > 25 for s in answer)):
        return None
    text = [s for _, s in lines]
    for start in range(len(answer) - k + 1):
        run = answer[start:start + k]
        for j in range(len(text) - k + 1):
            if text[j:j + k] == run:
                return lines[j][0], run
    return None


def ident(ex):
    return f"{ex.notebook[:2]}-cell{ex.cell}"


@pytest.mark.parametrize("ex", EXERCISES, ids=ident)
def test_no_lesson_shows_the_answer(ex):
    chapter = ex.notebook[:2]
    for ch, (name, lines) in LESSONS.items():
        if ch > chapter:
            continue
        where = shown_in(ex.answer, lines)
        assert where is None, (
            f"lesson {name}, cell {where[0]}, shows the answer of the exercise in {ex.notebook} cell {ex.cell}:\n"
            + "\n".join(where[1]) + "\nTeach it with a sibling example or a picture instead.")


@pytest.mark.parametrize("ex", EXERCISES, ids=ident)
def test_every_exercise_has_hints(ex):
    where = f"{ex.notebook} cell {ex.cell}"
    need = 2 if len(ex.answer) > 5 else 1
    assert len(ex.hints) >= need, (
        f"{where}: the markdown above the exercise needs {need} <details><summary>Hint..</summary> block(s) "
        f"(it has {len(ex.hints)}); an exercise of {len(ex.answer)} significant lines gets "
        f"{'two levels' if need == 2 else 'one'}")
    for summary, body in ex.hints:
        assert "lesson" in body.lower(), f"{where}: the hint {summary!r} must point at the lesson that teaches the idea"
        hint_lines = {normalize(line) for line in body.splitlines()} | {
            normalize(m) for m in re.findall(r"`([^`]+)`", body)}
        quoted = [s for s in ex.answer if len(s) > 25 and s in hint_lines]
        assert not quoted, f"{where}: the hint {summary!r} quotes the answer: {quoted[0]!r}"


def test_the_detector_sees_a_shown_answer():
    """The rule itself: 3 consecutive lines, or a whole short answer, count; fewer do not."""
    answer = ["total = total + value * weight", "count += 1", "mean = total / count"]
    lesson = [(4, "x = 1"), *[(7, s) for s in answer], (8, "y = 2")]
    assert shown_in(answer, lesson) == (7, answer)
    assert shown_in(answer, [(7, answer[0]), (7, answer[1]), (8, "other")]) is None
    short = ["return (f(x + h) - f(x - h)) / (2 * h)"]
    assert shown_in(significant(short[0]), [(2, "return (f(x + h) - f(x - h)) / (2 * h)")]) is not None
    assert significant("x = f(x)  # a comment\n# only a comment\nreturn out\n") == []
