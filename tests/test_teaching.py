"""The teaching bar: no lesson shows an exercise's answer, and every exercise has hints.

An answer is the significant lines of a solution region: stripped, without comments, blank
lines or trivial lines such as `return out`. A lesson shows it when it holds any 3 consecutive
significant lines of it, or the whole of an answer of 1-2 lines, in its code, its prose or its
printed output. Lessons are searched up to the exercise's own chapter.

A lesson also shows an answer when it holds the same code with other names: any 3 consecutive
significant lines of the answer whose token sequence, with every local name replaced by a
placeholder numbered in order of appearance (`total = total + v` and `acc = acc + x` both read
`_0 = _0 + _1`), equals that of 3 consecutive lines of a lesson's code cell. Attribute names,
keywords, builtins, modules and the names a lesson imports stay as they are, so `x.sum()` and
`x.mean()` differ, and windows of fewer than 24 tokens are too small to count.

Every exercise's markdown (the cell right above the solution cell) carries a collapsible
`<details>` hint that names the lesson to look at; exercises of more than 5 significant lines
get two. A hint never quotes a line of the answer.
"""

import re
from dataclasses import dataclass

import pytest
from code_shape import REGION, normalize, shapes, significant

from course_lib import REPO_DIR
from course_lib.course import exercises as build
from course_lib.course import nbtools

DETAILS = re.compile(r"<details>\s*<summary>(.*?)</summary>(.*?)</details>", re.S | re.I)


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


def lesson_code_shapes(path):
    """{renamed window: cell index} over every code cell of a lesson, 3 significant lines at a time."""
    found = {}
    for i, cell in enumerate(nbtools.read(path).cells):
        if cell.cell_type == "code":
            for shape in shapes(significant(cell.source)):
                found.setdefault(shape, i)
    return found


def shown_renamed(answer, lesson_shapes):
    """(lesson cell, the answer's lines) where the answer's structure appears with other names, or None."""
    for shape, start in shapes(answer).items():
        if shape in lesson_shapes:
            return lesson_shapes[shape], answer[start:start + 3]
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


SHAPES = {ch: lesson_code_shapes(REPO_DIR / "notebooks" / name) for ch, (name, _) in LESSONS.items()}


@pytest.mark.parametrize("ex", EXERCISES, ids=ident)
def test_no_lesson_shows_the_answer_with_other_names(ex):
    chapter = ex.notebook[:2]
    for ch, (name, _) in LESSONS.items():
        if ch > chapter:
            continue
        where = shown_renamed(ex.answer, SHAPES[ch])
        assert where is None, (
            f"lesson {name}, cell {where[0]}, holds the code of the exercise in {ex.notebook} cell {ex.cell} "
            "with other names (the same tokens once local names are numbered):\n" + "\n".join(where[1])
            + "\nA lesson teaches with a sibling that differs in what it computes, not only in its names.")


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


def test_the_detector_sees_an_answer_with_other_names():
    """The same three lines with every local renamed count; a different attribute or operator does not."""
    answer = significant("m = x.max(-1, keepdims=True)\ne = np.exp(x - m)\nreturn e / e.sum(-1, keepdims=True)")
    renamed = significant("top = s.max(-1, keepdims=True)\nw = np.exp(s - top)\nreturn w / w.sum(-1, keepdims=True)")
    other = significant("top = s.min(-1, keepdims=True)\nw = np.exp(s - top)\nreturn w / w.sum(-1, keepdims=True)")
    assert shown_renamed(answer, {s: 5 for s in shapes(renamed)}) == (5, answer)
    assert shown_renamed(answer, {s: 5 for s in shapes(other)}) is None
    assert shapes(["a = b", "c = d", "e = f"]) == {}, "windows too small to mean anything are left out"
