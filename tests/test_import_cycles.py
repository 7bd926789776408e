"""No import cycles inside course_lib: every module can be read, and imported, on its own.

The graph has an edge A -> B when module A imports course_lib module B, at the top of the
file or inside a function (a deferred import still ties the two modules together).
"""

import ast
from pathlib import Path

import course_lib

ROOT = Path(course_lib.__file__).parent


def module_name(path, root=ROOT, package="course_lib"):
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def imported_modules(tree, name, is_package, known):
    """The known modules that the parsed module `name` imports, anywhere in its body."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module
            for alias in node.names:  # `from pkg import mod` imports pkg.mod; `from mod import name`, mod
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m in known and m != name}


def import_graph(root=ROOT, package="course_lib"):
    files = {module_name(p, root, package): p for p in sorted(root.rglob("*.py"))}
    return {name: imported_modules(ast.parse(p.read_text(), str(p)), name, p.name == "__init__.py", files)
            for name, p in files.items()}


def find_cycle(graph):
    """One cycle as a list of modules [a, b, ..., a], or None."""
    state = {}  # module -> "open" while on the current path, "done" after
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = "open"
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = "done"
                stack.pop()
            elif state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = "open"
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_course_lib_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 50 and graph["course_lib.tensor.functions"], "the walk found too few modules or imports"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_walk_sees_a_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .c import g\n")  # a deferred, relative import
    (pkg / "sub" / "c.py").write_text("import numpy\nfrom .. import a\n")
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.sub.c"}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.sub.c", "pkg.a"]
    (pkg / "sub" / "c.py").write_text("import numpy\n")
    assert find_cycle(import_graph(pkg, "pkg")) is None


# Chapter order: chapter NN's code may use chapters 1..NN, never a later one. A later chapter plugs into
# an earlier one through a declared entry: a backend registered by name, or a plug-in point's context
# manager (gpt.model.attention_kernel, mamba.scan.scan_kernel) that the later chapter's code enters.
CHAPTER = {"autograd": 1, "tensor": 2, "graph": 3, "gpt": 4, "mamba": 5, "fast": 6, "cuda": 7,
           "custom_ops": 8, "infer": 9, "fused": 10, "simd": 10, "distributed": 11, "capstone": 12, "compiler": 13}

# (importer, imported): why the earlier chapter may name the later one. Nothing else may, and nothing does.
LATER_CHAPTER_ALLOWED = {}
REGISTRIES = {"register_backend"}   # calls whose string arguments name a later chapter's module by design


def chapter_of(module):
    """The chapter whose code `module` is, or None for the course's machinery (checks of no chapter,
    yours, viz, data, ...). checks.chNN belongs to chapter NN."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "checks" and parts[2][:2] == "ch" and parts[2][2:].isdigit():
        return int(parts[2][2:])
    return CHAPTER.get(parts[1]) if len(parts) > 1 else None


def later_chapter_imports(graph):
    return {(a, b) for a, targets in graph.items() for b in targets
            if chapter_of(a) is not None and chapter_of(b) is not None and chapter_of(b) > chapter_of(a)}


def later_chapter_names(root=ROOT, package="course_lib"):
    """(module, named module) for each string constant that names a later chapter's module outside a
    registry call: a module loaded by name is an import the graph cannot see."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        name, tree = module_name(path, root, package), ast.parse(path.read_text(), str(path))
        registered = {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call)
                      and getattr(node.func, "id", getattr(node.func, "attr", None)) in REGISTRIES
                      for arg in node.args}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in registered
                    and node.value.startswith(package + ".")):
                target = node.value.split(":")[0]
                if chapter_of(name) is not None and (chapter_of(target) or 0) > chapter_of(name):
                    found.add((name, target))
    return found


def test_no_chapter_reaches_a_later_one():
    graph = import_graph()
    packages = {m.split(".")[1] for m in graph if m.count(".") >= 1}
    assert len(CHAPTER.keys() & packages) >= 12, f"chapter packages moved: {sorted(CHAPTER.keys() - packages)}"
    wrong = sorted(later_chapter_imports(graph) - LATER_CHAPTER_ALLOWED.keys()) + sorted(later_chapter_names())
    assert not wrong, "an earlier chapter reaches a later one (plug the later one in through a registry):\n" + \
        "\n".join(f"  {a} (chapter {chapter_of(a)}) -> {b} (chapter {chapter_of(b)})" for a, b in wrong)


def test_the_chapter_order_allow_list_is_current():
    stale = set(LATER_CHAPTER_ALLOWED) - later_chapter_imports(import_graph())
    assert not stale, f"allowed later-chapter imports that no longer exist, remove them: {sorted(stale)}"


def test_the_chapter_order_walk_sees_a_backward_arrow(tmp_path):
    pkg = tmp_path / "course_lib"
    for sub in ("gpt", "fused", "tensor"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "gpt" / "model.py").write_text("def f():\n    from course_lib.fused import attention\n")
    (pkg / "fused" / "attention.py").write_text("from course_lib.gpt import model\n")
    (pkg / "tensor" / "backend.py").write_text(
        "register_backend('numba', 'course_lib.fused.attention')\nLOAD = 'course_lib.fused.attention'\n")
    graph = import_graph(pkg, "course_lib")
    assert later_chapter_imports(graph) == {("course_lib.gpt.model", "course_lib.fused.attention")}
    assert later_chapter_names(pkg, "course_lib") == {("course_lib.tensor.backend", "course_lib.fused.attention")}
