"""The answer key: every exercise's answer is declared and marked, and no pointer reaches it early.

course_lib/answer_key.py maps each exercise (chapter NN, its k-th check `name`, in solutions order) to
the definitions in course_lib that answer it, "module:qualname" (or a tuple of them), or to SOLVED when
the answer lives only in solutions/. This file proves, for every chapter that has a solutions notebook
(a new chapter is covered the day its notebook and its table exist):

1. The key is complete and true. Every exercise has an entry; every entry resolves; each definition it
   names starts its docstring with the banner
       The course's answer to exercise NN.k (`name`): read it once your check passes.
   and every banner in course_lib belongs to a definition that the key names for that exercise.
2. No unmarked copy. No definition in course_lib holds the code of a solution region (the comparison of
   tests/code_shape.py: 3 consecutive significant lines with local names numbered, at least two of them
   more than a loop header or a shape's unpacking, or the whole of a region of 1-2 lines) unless it, or
   a definition around it, carries the banner of that exercise or of a later one.
3. No pointer reaches the answer of exercise NN.k before its check passes. The pointers a learner
   follows before passing it:
   - the lessons of chapters up to NN: every module path (`course_lib/fast/matmul.py`, a folder),
     dotted name (`course_lib.gpt.model`, `fast.matmul`), file name (`matmul.py`, read in the package the
     same cell names), markdown link, import statement, and `??` or `inspect.getsource` cell;
   - the exercise notebook (exercises/NN_*.ipynb, as the learner gets it) up to and including the
     exercise's cells: the same pointers, its hints among them; and its imports, read strictly: the
     module of each `from ... import`, the module where each imported name is defined, and the module
     of each `alias.name` the given code uses. Such a module holds no answer of chapter NN or a later
     one, so that an exercise's helpers never sit beside an answer;
   - the check's messages (every string of the check and of the helpers it calls in its module); and
     the check never uses the exercise's answer as its oracle;
   - the README and the workspace note (course_lib's MIRRORED notes).
   A module path or dotted name leads to the whole file it names (a folder or a package to its
   __init__.py); a `??` or getsource cell to the definition it shows.
4. Hints and check messages never quote a line of the answer.

A failure names the exercise, the pointer, where it was found and what it leads to.
"""

import ast
import importlib
import inspect
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from code_shape import MIN_TOKENS, REGION, normalize, rename, scaffolding, shape_of, shapes, significant

from course_lib import REPO_DIR, answer_key
from course_lib.course import exercises, nbtools

LIB = REPO_DIR / "course_lib"
BANNER = re.compile(r"The course's answer to exercise (\d\d)\.(\d+) \(`(\w+)`\): read it once your check passes\.")


def banner(chapter, k, name):
    return f"The course's answer to exercise {chapter}.{k} (`{name}`): read it once your check passes."


# ---- the exercises -----------------------------------------------------------------------------------

@dataclass
class Exercise:
    chapter: str
    k: int
    name: str
    solutions: Path
    exercises: Path
    first_cell: int     # the first cell of the exercise (its markdown and hints start after the previous check)
    check_cell: int
    regions: list       # [(cell index, region text)]

    @property
    def ident(self):
        return f"{self.chapter}.{self.k}"

    @property
    def order(self):
        return (self.chapter, self.k)

    def __str__(self):
        cell = self.regions[0][0] if self.regions else self.check_cell
        return f"exercise {self.ident} (`{self.name}`, {self.solutions.name} cell {cell})"


def find_exercises():
    found = []
    for sol, ex in exercises.pairs():
        cells = nbtools.read(sol).cells
        regions, k, start = [], 0, 0
        for i, cell in enumerate(cells):
            if cell.cell_type != "code":
                continue
            if exercises.BEGIN in cell.source:
                regions += [(i, m.group(1)) for m in REGION.finditer(cell.source)]
            if exercises.is_check(cell):
                for name in exercises.CHECK_CALL.findall(cell.source):
                    k += 1
                    found.append(Exercise(sol.name[:2], k, name, sol, ex, start, i, regions))
                regions, start = [], i + 1
    return found


EXERCISES = find_exercises()
BY_ID = {ex.ident: ex for ex in EXERCISES}
CHAPTERS = sorted({ex.chapter for ex in EXERCISES})


def ident(ex):
    return f"{ex.ident}-{ex.name}"


# ---- the library: definitions, banners, significant lines --------------------------------------------

@dataclass
class Definition:
    module: str
    qualname: str
    path: Path
    start: int          # first line (decorators included) and last line, 1-based
    end: int
    banners: tuple      # ((chapter, k, name), ...) from the leading lines of its docstring
    doc: str            # its docstring as written (a decorator may hide it from inspect)

    def __str__(self):
        return f"{self.module}:{self.qualname} ({self.path.relative_to(REPO_DIR).as_posix()}:{self.start})"


def module_name(path):
    parts = path.relative_to(REPO_DIR).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def leading_banners(doc):
    out = []
    for line in (doc or "").strip().splitlines():
        m = BANNER.fullmatch(line.strip())
        if not m:
            break
        out.append((m.group(1), int(m.group(2)), m.group(3)))
    return tuple(out)


@dataclass
class Module:
    name: str
    path: Path
    definitions: list   # Definition, outer before inner
    lines: list         # (line number, significant line)
    doc: str


def parse_module(path):
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    name = module_name(path)
    defs = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                doc = ast.get_docstring(child, clean=True) or ""
                defs.append(Definition(name, prefix + child.name, path, start, child.end_lineno,
                                       leading_banners(doc), doc))
                walk(child, prefix + child.name + ("." if isinstance(child, ast.ClassDef) else ".<locals>."))
            else:
                walk(child, prefix)
    walk(tree, "")
    lines = [(n, s) for n, line in enumerate(text.splitlines(), 1) for s in significant(line)]
    return Module(name, path, defs, lines, ast.get_docstring(tree) or "")


LIBRARY = {m.name: m for m in (parse_module(p) for p in sorted(LIB.rglob("*.py")) if "__pycache__" not in p.parts)}


def qualname_of(module, qualname):
    """The Definition `module:qualname`, or None. Qualnames of nested functions may leave out `<locals>`."""
    mod = LIBRARY.get(module)
    if mod is None:
        return None
    for d in mod.definitions:
        if qualname in (d.qualname, d.qualname.replace(".<locals>", "")):
            return d
    return None


def enclosing(module, line):
    """The definitions of `module` around `line`, outermost first."""
    return [d for d in LIBRARY[module].definitions if d.start <= line <= d.end]


# ---- the key -------------------------------------------------------------------------------------------

def entries(ex):
    """The key's entry for the exercise as a tuple of "module:qualname" (empty for SOLVED), or None."""
    table = answer_key.ANSWERS.get(ex.chapter)
    if table is None or ex.name not in table:
        return None
    value = table[ex.name]
    if value == answer_key.SOLVED:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


@cache
def answer_definitions(ident):
    """The Definitions the key names for an exercise (those that resolve)."""
    found = []
    for entry in entries(BY_ID[ident]) or ():
        module, _, qual = entry.partition(":")
        d = qualname_of(module, qual)
        if d is not None:
            found.append(d)
    return tuple(found)


def answers_in(module, span=None, since=None, only=None):
    """[(exercise, Definition)] of the answers in `module` (within lines `span` if given), of the exercise
    `only`, or of every exercise whose chapter is `since` or later."""
    out = []
    for ex in EXERCISES:
        if only is not None and ex.ident != only:
            continue
        if since is not None and ex.chapter < since:
            continue
        for d in answer_definitions(ex.ident):
            if d.module != module:
                continue
            if span is None or (d.start <= span[1] and span[0] <= d.end):
                out.append((ex, d))
    return out


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_key_lists_every_exercise_of_the_chapter(chapter):
    names = [ex.name for ex in EXERCISES if ex.chapter == chapter]
    table = answer_key.ANSWERS.get(chapter)
    assert table is not None, f"course_lib/answer_key.py has no table for chapter {chapter} (CH{chapter} = {{...}})"
    missing = [f"{ex.ident} `{ex.name}`" for ex in EXERCISES if ex.chapter == chapter and ex.name not in table]
    extra = [name for name in table if name not in names]
    assert not missing and not extra, (
        f"chapter {chapter}'s table in course_lib/answer_key.py" + (f" lacks {', '.join(missing)}" if missing else "")
        + ("; it " if missing and extra else " ") + (f"names checks the notebook does not call: {extra}" if extra else "")
        + f"\n(the exercises, in solutions order: {names})")
    assert list(table) == [n for n in names if n in table], (
        f"chapter {chapter}'s table is not in solutions order:\n  key:       {list(table)}\n  solutions: {names}")


@pytest.mark.parametrize("ex", EXERCISES, ids=ident)
def test_each_entry_resolves_and_carries_its_banner(ex):
    found = entries(ex)
    assert found is not None, f"{ex}: no entry in course_lib/answer_key.py's CH{ex.chapter}"
    problems = []
    for entry in found:
        module, sep, qual = entry.partition(":")
        if not sep:
            problems.append(f"{entry!r} is not of the form 'module:qualname'")
            continue
        try:
            obj = importlib.import_module(module)
            for part in qual.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            problems.append(f"{entry!r} does not resolve: {type(e).__name__}: {e}")
            continue
        d = qualname_of(module, qual)
        if d is None:
            problems.append(f"{entry!r} is not a def or class of {module}")
            continue
        doc = d.doc.strip().splitlines()
        want = banner(ex.chapter, ex.k, ex.name)
        if not any(line.strip() == want for line in doc[:len(d.banners) or 1]):
            problems.append(f"{d}: its docstring starts with {doc[0]!r} instead of the banner\n    {want}"
                            if doc else f"{d} has no docstring; it must start with the banner\n    {want}")
    assert not problems, f"{ex}:\n  " + "\n  ".join(problems)


def test_every_banner_is_in_the_key():
    problems = []
    for mod in LIBRARY.values():
        for d in mod.definitions:
            for chapter, k, name in d.banners:
                ex = BY_ID.get(f"{chapter}.{k}")
                if ex is None or ex.name != name:
                    right = next((e for e in EXERCISES if e.chapter == chapter and e.name == name), None)
                    problems.append(f"{d}: banner of exercise {chapter}.{k} (`{name}`), which does not exist"
                                    + (f"; `{name}` is exercise {right.ident}" if right else ""))
                elif d not in answer_definitions(ex.ident):
                    problems.append(f"{d}: banner of {ex}, but the key does not name it")
    assert not problems, "banners the key does not account for:\n  " + "\n  ".join(problems)


# ---- unmarked copies of an answer in course_lib --------------------------------------------------------

@cache
def library_windows(k):
    """{renamed shape of k consecutive significant lines: [(module, first line number)]} over course_lib."""
    found = {}
    for mod in LIBRARY.values():
        texts = [s for _, s in mod.lines]
        parsed = [shape_of(s) for s in texts]
        for i in range(len(texts) - k + 1):
            window = parsed[i:i + k]
            if any(w is None for w in window) or (k == 3 and sum(len(w) for w in window) < MIN_TOKENS):
                continue
            if k == 3 and sum(not scaffolding(t) for t in texts[i:i + k]) < 2:
                continue            # loop headers and shape unpacking: every kernel of the kind has them
            found.setdefault(rename(window), []).append((mod.name, mod.lines[i][0]))
    return found


@cache
def library_exact():
    found = {}
    for mod in LIBRARY.values():
        for n, s in mod.lines:
            found.setdefault(s, []).append((mod.name, n))
    return found


def copies_of(lines):
    """[(module, line, the answer's lines)] where course_lib holds the region's significant `lines`."""
    out = []
    if len(lines) >= 3:
        windows = library_windows(3)
        for shape, start in shapes(lines).items():
            out += [(m, n, lines[start:start + 3]) for m, n in windows.get(shape, [])]
        return out
    if not lines:
        return out
    parsed = [shape_of(s) for s in lines]
    if all(p is not None for p in parsed) and sum(len(p) for p in parsed) >= MIN_TOKENS:
        out += [(m, n, lines) for m, n in library_windows(len(lines)).get(rename(parsed), [])]
    if all(len(s) > 25 for s in lines):
        exact = library_exact()
        for m, n in exact.get(lines[0], []):
            mod_lines = [s for _, s in LIBRARY[m].lines]
            i = next(j for j, (num, _) in enumerate(LIBRARY[m].lines) if num == n)
            if mod_lines[i:i + len(lines)] == lines:
                out.append((m, n, lines))
    return out


def unmarked_copies(ex):
    problems = []
    for cell, region in ex.regions:
        for module, line, shown in copies_of(significant(region)):
            around = enclosing(module, line)
            marks = [(c, j) for d in around for c, j, _ in d.banners]
            if any((c, j) >= ex.order for c, j in marks):
                continue
            where = f"{LIBRARY[module].path.relative_to(REPO_DIR).as_posix()}:{line}"
            inside = f" (in `{around[-1].qualname}`)" if around else " (at module level)"
            problems.append(f"{where}{inside} holds the code of its solution region (cell {cell}) with no banner "
                            f"of this exercise:\n      " + "\n      ".join(shown))
    return problems


@pytest.mark.parametrize("ex", EXERCISES, ids=ident)
def test_no_unmarked_copy_of_the_answer_in_course_lib(ex):
    problems = unmarked_copies(ex)
    assert not problems, (f"{ex}: an unmarked copy of its answer in course_lib (mark the definition that answers "
                          "it with its banner and name it in the key, or write the copy another way):\n  "
                          + "\n  ".join(dict.fromkeys(problems)))


# ---- pointers --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pointer:
    where: str          # "lesson 02_tensors.ipynb cell 11", "README.md", ...
    text: str           # what the learner reads: the path, the name, the import
    module: str         # the module it leads to
    span: tuple = None  # the lines it shows (a `??` or getsource cell), or None for the whole file
    strict: bool = False  # an exercise notebook's import: its module holds no answer of the chapter or later

    def leads_to(self):
        return self.module + (f" lines {self.span[0]}-{self.span[1]}" if self.span else "")


SUBPACKAGES = sorted(p.name for p in LIB.iterdir() if (p / "__init__.py").exists())
PATH = re.compile(r"(?:work/)?\bcourse_lib(?:/[\w.-]+)*/?")
PACKAGE_PATH = re.compile(r"(?<![\w/.-])(?:" + "|".join(SUBPACKAGES) + r")/(?:[\w-]+/)*(?:\w+\.py\b)?")
DOTTED = re.compile(r"\b(?:course_lib|" + "|".join(SUBPACKAGES) + r")(?:\.\w+)+")
BARE_FILE = re.compile(r"(?<![\w/.-])(\w+)\.py\b")
SHOW = re.compile(r"^\s*(?:\?\?\s*([\w.]+)|([\w.]+)\s*\?\?)\s*$|getsource\(\s*([\w.]+)\s*\)", re.M)


def module_of_path(text):
    """The module a course_lib path leads to: a file, or a folder's __init__.py; None if it is not there."""
    rel = text.removeprefix("work/").rstrip("/.")
    path = REPO_DIR / rel
    if path.suffix == ".py" and path.is_file():
        return module_name(path)
    if (path / "__init__.py").is_file():
        return module_name(path / "__init__.py")
    if path.with_suffix(".py").is_file():
        return module_name(path.with_suffix(".py"))
    return None


def resolve_dotted(text):
    """(module, object or None) for a dotted name: the longest prefix that is a module, then attributes.
    An object defined elsewhere (a package's re-export) leads to the module it is defined in. A name that
    starts with a subpackage (`fast.matmul`) counts only when it resolves to the end."""
    parts = text.split(".")
    explicit = parts[0] == "course_lib"
    if not explicit:
        parts = ["course_lib"] + parts
    for n in range(len(parts), 1, -1):
        name = ".".join(parts[:n])
        if name not in LIBRARY:
            continue
        try:
            obj = importlib.import_module(name)
        except ImportError:
            return None, None
        for attr in parts[n:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                return (name, None) if explicit else (None, None)
        if n == len(parts):
            return name, None
        return defining_module(obj) or name, obj
    return None, None


def defining_module(obj):
    if inspect.ismodule(obj):
        return obj.__name__ if obj.__name__ in LIBRARY else None
    mod = getattr(obj, "__module__", None)
    if mod in LIBRARY:
        return mod
    return None


def span_of(obj):
    try:
        lines, start = inspect.getsourcelines(inspect.unwrap(obj))
    except (TypeError, OSError):
        return None
    return (start, start + len(lines) - 1)


def package_of(module):
    return module if LIBRARY[module].path.name == "__init__.py" else module.rpartition(".")[0]


def text_pointers(text, where, named=None):
    """The pointers in prose, a code cell's text, a printed output or a message. A bare file name
    (`optim.py`) leads to the file of that name in a package the same text names, else in one that
    `named` holds (the packages the notebook named before: the set grows with this text's), else to
    every file of that name."""
    found = []
    packages = set()
    paths = [(m.group(0), module_of_path(m.group(0))) for m in PATH.finditer(text)]
    paths += [(m.group(0), module_of_path("course_lib/" + m.group(0))) for m in PACKAGE_PATH.finditer(text)]
    for shown, module in paths:
        if module:
            found.append(Pointer(where, shown, module))
            packages.add(package_of(module))
    for m in DOTTED.finditer(text):
        module, _ = resolve_dotted(m.group(0))
        if module:
            found.append(Pointer(where, m.group(0), module))
            packages.add(package_of(module))
    for m in BARE_FILE.finditer(text):
        stem = m.group(1)
        candidates = [name for name, mod in LIBRARY.items() if mod.path.stem == stem]
        near = [c for c in candidates if c.rpartition(".")[0] in packages]
        earlier = [c for c in candidates if c.rpartition(".")[0] in (named or ())]
        for module in near or earlier or candidates:
            found.append(Pointer(where, m.group(0), module))
    if named is not None:
        named |= packages
    return found


class Namespace:
    """What the names of a notebook's code mean, from its course_lib imports, cell by cell."""

    def __init__(self):
        self.names = {}     # local name -> the object (a module or a definition)

    def read(self, source, where, strict):
        """The pointers of one code cell's imports, `??`/getsource lines and (strict) `alias.name` uses."""
        found = []
        tree = parse_cell(source)
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] != "course_lib" or alias.name not in LIBRARY:
                        continue
                    found.append(Pointer(where, f"import {alias.name}", alias.name, strict=strict))
                    self.names[alias.asname or alias.name.split(".")[0]] = importlib.import_module(
                        alias.name if alias.asname else "course_lib")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "course_lib":
                if node.module not in LIBRARY:
                    continue
                package = importlib.import_module(node.module)
                for alias in node.names:
                    obj = getattr(package, alias.name, None)
                    text = f"from {node.module} import {alias.name}"
                    if inspect.ismodule(obj) and obj.__name__ in LIBRARY:
                        found.append(Pointer(where, text, obj.__name__, strict=strict))
                    else:
                        found.append(Pointer(where, text, node.module, strict=strict))
                        home = defining_module(obj) if obj is not None else None
                        if strict and home and home != node.module:
                            found.append(Pointer(where, text + f" (defined in {home})", home, strict=True))
                    if obj is not None:
                        self.names[alias.asname or alias.name] = obj
            elif strict and isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                base = self.names.get(node.value.id)
                if inspect.ismodule(base):
                    obj = getattr(base, node.attr, None)
                    home = defining_module(obj) if obj is not None else None
                    if home:
                        found.append(Pointer(where, f"{node.value.id}.{node.attr}", home, strict=True))
        for m in SHOW.finditer(source):
            name = next(g for g in m.groups() if g)
            head, *rest = name.split(".")
            obj = self.names.get(head)
            for attr in rest:
                obj = getattr(obj, attr, None)
            home = defining_module(obj) if obj is not None else None
            if home:
                span = None if inspect.ismodule(obj) else span_of(obj)
                found.append(Pointer(where, m.group(0).strip(), home, span))
        return found


def parse_cell(source):
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))
             and not line.rstrip().endswith("?") and not line.lstrip().startswith("?")]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def cell_texts(cell):
    texts = [cell.source]
    for o in cell.get("outputs", []) if cell.cell_type == "code" else []:
        texts.append(o.get("text", "") or o.get("data", {}).get("text/plain", ""))
        texts.append(o.get("data", {}).get("text/markdown", ""))
    return "\n".join(t if isinstance(t, str) else "".join(t) for t in texts)


def notebook_pointers(path, label, upto=None, strict=False):
    """The pointers of a notebook's cells (those before cell `upto`, if given)."""
    found, names, named = [], Namespace(), set()
    for i, cell in enumerate(nbtools.read(path).cells):
        if upto is not None and i >= upto:
            break
        where = f"{label} {path.parent.name}/{path.name} cell {i}"
        found += text_pointers(cell_texts(cell), where, named)
        if cell.cell_type == "code":
            cell_found = names.read(cell.source, where, strict)
            named |= {package_of(p.module) for p in cell_found}
            found += cell_found
    return found


@cache
def lesson_pointers(chapter):
    lessons = sorted((REPO_DIR / "notebooks").glob(f"{chapter}_*.ipynb"))
    return tuple(p for path in lessons for p in notebook_pointers(path, "lesson"))


@cache
def exercise_notebook_pointers(chapter, upto):
    ex = next(e for e in EXERCISES if e.chapter == chapter)
    return tuple(notebook_pointers(ex.exercises, "exercise notebook", upto=upto, strict=True))


@cache
def directions():
    """The README's pointers, and the workspace note's (every MIRRORED note in course_lib)."""
    found = text_pointers((REPO_DIR / "README.md").read_text(encoding="utf-8"), "README.md")
    for mod in LIBRARY.values():
        if "MIRRORED" not in mod.path.read_text(encoding="utf-8"):
            continue
        notes = getattr(importlib.import_module(mod.name), "MIRRORED", None)
        for folder, value in (notes or {}).items():
            text = value[-1] if isinstance(value, tuple) else str(value)
            found += text_pointers(text, f"the workspace note of work/{folder} ({mod.path.relative_to(REPO_DIR)})")
    return tuple(found)


# ---- the check: its messages and its oracle --------------------------------------------------------------

def check_closure(ex):
    """(the check module, [ast nodes of the check function and of the module-level helpers it reaches])."""
    name = f"course_lib.checks.ch{ex.chapter}"
    if name not in LIBRARY:
        return None, []
    module = importlib.import_module(name)
    tree = ast.parse(LIBRARY[name].path.read_text(encoding="utf-8"))
    top = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            top[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    top[target.id] = node
    if ex.name not in top:
        return module, []
    seen, todo = [], [top[ex.name]]
    while todo:
        node = todo.pop()
        if any(node is s for s in seen):
            continue
        seen.append(node)
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and sub.id in top and sub.id != ex.name:
                todo.append(top[sub.id])
    return module, seen


def message_strings(nodes):
    out = []
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                out.append(sub.value)
    return out


def referenced_objects(module, nodes):
    """Every object a dotted name in the nodes leads to, from the check module's globals."""
    found = []
    for node in nodes:
        for sub in ast.walk(node):
            chain = []
            while isinstance(sub, ast.Attribute):
                chain.append(sub.attr)
                sub = sub.value
            if not isinstance(sub, ast.Name) or sub.id not in vars(module):
                continue
            obj = vars(module)[sub.id]
            found.append(obj)
            for attr in reversed(chain):
                obj = getattr(obj, attr, None)
                if obj is None:
                    break
                found.append(obj)
    return found


def is_within(obj, d):
    if not callable(obj) and not inspect.isclass(obj):
        return False
    if defining_module(obj) != d.module:
        return False
    span = span_of(obj)
    return span is not None and d.start <= span[0] and span[1] <= d.end


# ---- the walk -------------------------------------------------------------------------------------------

def pointers_before(ex):
    """Every pointer a learner may follow before passing the exercise."""
    found = [p for chapter in CHAPTERS if chapter <= ex.chapter for p in lesson_pointers(chapter)]
    found += exercise_notebook_pointers(ex.chapter, ex.check_cell)
    module, nodes = check_closure(ex)
    for text in message_strings(nodes):
        found += text_pointers(text, f"a message of check `{ex.name}` (course_lib/checks/ch{ex.chapter}.py)")
    found += directions()
    return found


def violations(ex):
    problems = []
    for p in dict.fromkeys(pointers_before(ex)):
        for other, d in answers_in(p.module, p.span, only=ex.ident):
            problems.append(f"{p.where}: {p.text!r} leads to {p.leads_to()}, which holds its answer {d.qualname}")
        if p.strict:
            for other, d in answers_in(p.module, since=ex.chapter):
                if other.ident != ex.ident:
                    problems.append(f"{p.where}: the notebook imports {p.text!r}; {p.module} holds {d.qualname}, the "
                                    f"answer of exercise {other.ident} (`{other.name}`): an exercise's helpers live "
                                    "in modules that hold no answer of its chapter or a later one")
    module, nodes = check_closure(ex)
    if module is not None:
        for obj in referenced_objects(module, nodes):
            for d in answer_definitions(ex.ident):
                if is_within(obj, d):
                    problems.append(f"check `{ex.name}` (course_lib/checks/ch{ex.chapter}.py) uses the course's answer "
                                    f"{d.qualname} ({getattr(obj, '__qualname__', obj)!s}) as its oracle")
    return list(dict.fromkeys(problems))


@pytest.mark.parametrize("ex", EXERCISES, ids=ident)
def test_no_pointer_reaches_the_answer_before_its_check_passes(ex):
    problems = violations(ex)
    assert not problems, f"{ex}: a learner reaches its answer before passing it:\n  " + "\n  ".join(problems)


def quoted_lines(text, answer):
    """The answer's lines (over 25 characters) that the text holds as a line or a `quoted` span."""
    held = {normalize(line) for line in text.splitlines()} | {normalize(m) for m in re.findall(r"`([^`]+)`", text)}
    return [s for s in answer if len(s) > 25 and s in held]


@pytest.mark.parametrize("ex", EXERCISES, ids=ident)
def test_no_hint_or_check_message_quotes_the_answer(ex):
    answer = [s for _, region in ex.regions for s in significant(region)]
    cells = nbtools.read(ex.exercises).cells
    problems = []
    for i in range(ex.first_cell, ex.check_cell):
        if cells[i].cell_type == "markdown":
            problems += [f"the markdown of cell {i} quotes {s!r}" for s in quoted_lines(cells[i].source, answer)]
    _, nodes = check_closure(ex)
    for text in message_strings(nodes):
        problems += [f"a message of check `{ex.name}` quotes {s!r}" for s in quoted_lines(text, answer)]
    assert not problems, f"{ex}: " + "; ".join(dict.fromkeys(problems))


# ---- the rules themselves ------------------------------------------------------------------------------

def test_the_pointer_reader_finds_each_kind():
    text = ("Read `course_lib/fast/matmul.py`, then course_lib.gpt.model.causal_attention, then fast.pool "
            "and `passes.py` of course_lib.infer, and simd/tiles.py.")
    found = {(p.text, p.module) for p in text_pointers(text, "here")}
    assert ("course_lib/fast/matmul.py", "course_lib.fast.matmul") in found
    assert ("course_lib.gpt.model.causal_attention", "course_lib.gpt.model") in found
    assert ("fast.pool", "course_lib.fast.pool") in found
    assert ("passes.py", "course_lib.infer.passes") in found
    assert ("simd/tiles.py", "course_lib.simd.tiles") in found
    named = {"course_lib.tensor"}          # a notebook that named course_lib/tensor/ before
    assert {p.module for p in text_pointers("`optim.py` runs them", "here", named)} == {"course_lib.tensor.optim"}
    assert len({p.module for p in text_pointers("`optim.py` runs them", "here")}) > 1
    names = Namespace()
    shown = names.read("from course_lib.tensor import Tensor\nimport course_lib.tensor as ct\nct.TensorData\n", "x", True)
    modules = {p.module for p in shown}
    assert {"course_lib.tensor", "course_lib.tensor.tensor", "course_lib.tensor.tensor_data"} <= modules
    assert {p.module for p in names.read("Tensor??", "x", False)} == {"course_lib.tensor.tensor"}


def test_the_copy_finder_sees_renamed_code():
    """Three lines of a library function, with every local renamed, are found where they are."""
    mod = LIBRARY["course_lib.answer_key"]
    assert mod.definitions == [], "the key itself defines nothing"
    d = qualname_of("course_lib.checks", "exercise")
    source = inspect.getsource(importlib.import_module("course_lib.checks").exercise)
    lines = significant(source)
    renamed = [re.sub(r"\bchapter\b", "ch", line) for line in lines]
    found = {(m, n) for m, n, _ in copies_of(renamed)}
    assert any(m == "course_lib.checks" and d.start <= n <= d.end for m, n in found)


# ---- lessons never run an answer before its exercise -----------------------------------------------------

@cache
def answer_index():
    """{(module, qualname): exercise} for every definition the key names."""
    return {(d.module, d.qualname): ex for ex in EXERCISES for d in answer_definitions(ex.ident)}


def answer_of(obj):
    """The exercise whose answer `obj` is (a function, a class, a method, a compiled kernel), or None."""
    obj = getattr(obj, "py_func", obj)          # a Numba dispatcher: the Python function it compiles
    try:
        obj = inspect.unwrap(obj)
    except ValueError:
        return None
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    return answer_index().get((module, qualname))


def member(obj, attr):
    """getattr, and for a package a submodule that nothing has imported yet (`from course_lib import graph`)."""
    found = getattr(obj, attr, None)
    if found is None and inspect.ismodule(obj) and hasattr(obj, "__path__"):
        try:
            found = importlib.import_module(f"{obj.__name__}.{attr}")
        except ImportError:
            return None
    return found


def dotted_chain(node):
    """(`a`, ['b', 'c']) for the expression a.b.c, else (None, [])."""
    chain = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    return (node.id, chain[::-1]) if isinstance(node, ast.Name) else (None, [])


def answers_used(source, where, chapter, names):
    """The answers of chapter `chapter` or a later one that a lesson's code cell imports or calls, each as
    a message. `names` ({local name: object}) carries the notebook's course_lib imports from cell to cell.

    Only a definition the key names counts (a function, a class, a method reached as `Cls.method`): the
    library's entry points that the later chapters build on (`Mamba`, `discretize`, `train`) run answers
    inside them, and a lesson may use them as long as they are not answers themselves."""
    tree = parse_cell(source)
    if tree is None:
        return []
    found = []

    def flag(verb, shown, obj):
        ex = answer_of(obj)
        if ex is not None and ex.chapter >= chapter:
            home = f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', shown)}"
            found.append(f"{where} {verb} `{shown}` ({home}), the course's answer to exercise {ex.ident} "
                         f"(`{ex.name}`), which the learner has not yet written")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "course_lib":
            try:
                module = importlib.import_module(node.module)
            except ImportError:
                continue
            for alias in node.names:
                obj = member(module, alias.name)
                if obj is None:
                    continue
                names[alias.asname or alias.name] = obj
                flag("imports", alias.name, obj)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "course_lib":
                    names[alias.asname or "course_lib"] = importlib.import_module(
                        alias.name if alias.asname else "course_lib")
    calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Name, ast.Attribute)) or not isinstance(node.ctx, ast.Load):
            continue
        head, chain = dotted_chain(node)
        if head not in names:
            continue
        obj = names[head]
        for attr in chain:
            obj = member(obj, attr) if obj is not None else None
        if obj is None or (inspect.ismodule(names[head]) and not chain):
            continue
        flag("calls" if id(node) in calls else "uses", ".".join([head] + chain), obj)
    return found


def lesson_answer_uses(path):
    """Every use of an answer of its chapter or a later one in a lesson's code cells (NN_*.ipynb comes
    before exercises NN.*)."""
    chapter, names, found = path.name[:2], {}, []
    for i, cell in enumerate(nbtools.read(path).cells):
        if cell.cell_type == "code":
            found += answers_used(cell.source, f"lesson {path.name} cell {i}", chapter, names)
    return list(dict.fromkeys(found))


LESSONS = sorted((REPO_DIR / "notebooks").glob("[0-9][0-9]_*.ipynb"))

# Lessons that still run answers of their own chapter, to be rebuilt another way. The mark is strict: a
# lesson that no longer does must leave this list, and no lesson may join it.
STILL_RUNS_ANSWERS = {}


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.xfail(
    strict=True, reason=f"still runs {STILL_RUNS_ANSWERS[p.stem]}")) if p.stem in STILL_RUNS_ANSWERS else p
    for p in LESSONS], ids=lambda p: p.stem)
def test_no_lesson_runs_an_answer_before_its_exercise(path):
    problems = lesson_answer_uses(path)
    assert not problems, (f"{path.name} runs the course's answer to an exercise that comes after it (build what "
                          "the lesson shows another way, or use the library's entry point that is not an "
                          "answer):\n  " + "\n  ".join(problems))


def test_the_lesson_reader_sees_imports_and_calls_of_answers():
    # main's lesson 05 before it was rebuilt: its imports (cell 3) and its discretization (cell 11)
    names = {}
    cell3 = ("from course_lib.mamba import (discretize, discretize_euler, discretize_zoh, readout, selective_scan_chunked,\n"
             "                              selective_scan_parallel, selective_scan_sequential, ssm_convolve, ssm_kernel,\n"
             "                              ssm_recurrent)\n"
             "from course_lib.mamba import Mamba, MambaBlock, MambaCache, MambaConfig\n")
    found = answers_used(cell3, "lesson 05_mamba.ipynb cell 3", "05", names)
    assert len(found) == 2, found
    assert "lesson 05_mamba.ipynb cell 3 imports `discretize_zoh`" in found[0] and "exercise 05.1" in found[0]
    assert "imports `selective_scan_sequential`" in found[1] and "exercise 05.2 (`selective_scan`)" in found[1]
    found = answers_used("A_bar, B_bar = discretize_zoh(A4, B4, 0.2)\n", "lesson 05_mamba.ipynb cell 11", "05", names)
    assert found == ["lesson 05_mamba.ipynb cell 11 calls `discretize_zoh` (course_lib.mamba.ssm:discretize_zoh), "
                     "the course's answer to exercise 05.1 (`discretize_zoh`), which the learner has not yet written"]
    found = answers_used('for name, rule in [("ZOH", discretize_zoh), ("Euler", discretize_euler)]:\n    rule(a, b, 0.3)\n',
                         "cell 9", "05", names)
    assert len(found) == 1 and "cell 9 uses `discretize_zoh`" in found[0]
    # through a module alias (a subpackage imported by name too), and a method reached through its class
    assert len(answers_used("from course_lib import graph as G\nG.gradients(y, [x])\n", "cell 1", "03", {})) == 1
    found = answers_used("import course_lib.mamba.scan as scan\nfrom course_lib.mamba import MambaBlock\n"
                         "scan.selective_scan_sequential(x, d, A, B, C, D)\nMambaBlock.step\n", "cell 1", "05", {})
    assert sorted(m.split("`")[1] for m in found) == ["MambaBlock.step", "scan.selective_scan_sequential"], found
    # no false positives: the library's entry points that are not answers themselves
    fine = ("from course_lib.mamba import Mamba, MambaBlock, MambaConfig, discretize, selective_scan_chunked\n"
            "from course_lib.gpt import TrainConfig, train\n"
            "y = selective_scan_chunked(*args)\nmodel = Mamba(MambaConfig())\na, b = discretize(x, d, A, B)\n")
    assert answers_used(fine, "cell 1", "05", {}) == []
    # an answer of an earlier chapter is the learner's by now; in its own chapter's lesson it is not
    earlier = "from course_lib.gpt.model import KVCache\ncache = KVCache(2)\n"
    assert answers_used(earlier, "cell 1", "05", {}) == []
    assert len(answers_used(earlier, "cell 1", "04", {})) == 2
