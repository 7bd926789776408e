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
