"""Turn functions and classes defined in a notebook into the source of a standalone module.

`module_source([mul, mul_backward])` returns text that defines both, preceded by what they
need from the notebook: the helpers they call (found by walking the names in their source),
the imports (`np`, `torch`, `cuda`, ...) and plain constants (`TPB = 16`). Anything else a
function refers to is listed in a comment, so a missing piece is visible, not silent.
"""

import ast
import builtins
import importlib
import inspect
import linecache
import sys
import textwrap

PLAIN = (int, float, complex, str, bytes, bool, type(None))


def defined_here(obj, module="__main__"):
    """The Python function or class behind obj (a numba dispatcher has one) if `module` defined it."""
    obj = getattr(obj, "py_func", None) or getattr(obj, "fn", None) or obj
    if inspect.isfunction(obj):
        obj = inspect.unwrap(obj)  # under a decorator such as @torch.no_grad(): the notebook's function
    if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", None) == module:
        return obj
    return None


def source_of(obj):
    """inspect.getsource, plus classes defined in a notebook cell, which Python 3.11 cannot find:
    their methods know the cell they came from, so the class is looked up in that cell's text."""
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        if not inspect.isclass(obj):
            raise
    for member in vars(obj).values():
        code = getattr(inspect.unwrap(getattr(member, "__func__", member)), "__code__", None)
        if code is None:
            continue
        lines = linecache.getlines(code.co_filename)
        for node in ast.walk(ast.parse("".join(lines))):
            if (isinstance(node, ast.ClassDef) and node.name == obj.__name__
                    and node.lineno <= code.co_firstlineno <= node.end_lineno):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                return textwrap.dedent("".join(lines[start - 1:node.end_lineno]))
    raise OSError(f"the source of class {obj.__name__} was not found")


def names_used(source):
    """Every name the source reads from outside (decorators and default values included), not its
    own arguments and local variables: a notebook global that shares a local's name is not needed."""
    tree = ast.parse(source)
    nodes = list(ast.walk(tree))
    local = {n.arg for n in nodes if isinstance(n, ast.arg)}
    local |= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    read = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read - local


def _import_line(name, value):
    """`import x as name` or `from m import q as name` when the value can be imported back, else None."""
    if inspect.ismodule(value):
        mod = value.__name__
        if "." in mod:
            parent, _, leaf = mod.rpartition(".")
            return f"from {parent} import {leaf}" + (f" as {name}" if leaf != name else "")
        return f"import {mod}" + (f" as {name}" if mod != name else "")
    for home in ("numba", "numpy", "math"):  # objects known by name only, such as numba's float32
        module = sys.modules.get(home)
        if module is not None and getattr(module, name, None) is value:
            return f"from {home} import {name}"
    mod, qual = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if mod and qual and "." not in qual and mod != "__main__":
        try:
            if getattr(importlib.import_module(mod), qual) is value:
                return f"from {mod} import {qual}" + (f" as {name}" if qual != name else "")
        except (ImportError, AttributeError):
            pass
    return None


def _plain_constant(value):
    if isinstance(value, PLAIN) or (isinstance(value, tuple) and all(isinstance(v, PLAIN) for v in value)):
        text = repr(value)
        return text if len(text) < 200 else None
    return None


def module_source(objs, namespace=None):
    """The source of a module defining objs and everything from the notebook they need.

    namespace: the notebook's globals (default: the defining module's, found from the objects).
    """
    defs, imports, constants, unknown = {}, {}, {}, []
    todo = [o for o in (defined_here(x) for x in objs) if o is not None]
    while todo:
        obj = todo.pop(0)
        if obj.__name__ in defs:
            continue
        source = source_of(obj)
        defs[obj.__name__] = source
        scope = namespace if namespace is not None else (
            obj.__globals__ if inspect.isfunction(obj) else vars(inspect.getmodule(obj) or builtins))
        for name in sorted(names_used(source)):
            if name in defs or name in imports or name in constants or name not in scope:
                continue
            value = scope[name]
            if name in vars(builtins) and value is vars(builtins)[name]:
                continue
            helper = defined_here(value)
            if helper is not None:
                todo.append(helper)
            elif (line := _import_line(name, value)) is not None:
                imports[name] = line
            elif (text := _plain_constant(value)) is not None:
                constants[name] = f"{name} = {text}"
            else:
                unknown.append(name)
    parts = sorted(set(imports.values()))
    if constants:
        parts += [""] + list(constants.values())
    if unknown:
        parts += ["", "# not captured (define them again if needed): " + ", ".join(sorted(set(unknown)))]
    for source in reversed(list(defs.values())):  # helpers first, the exercise's own function last
        parts += ["", "", source.rstrip()]
    return "\n".join(parts).strip() + "\n"
