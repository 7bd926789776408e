"""Your code, carried forward: what you wrote in one chapter runs the chapters after it.

When a check passes in your exercise notebook, your functions are saved in work/yours/chNN.py
(see `answers`). A lesson then asks for the pieces it needs:

    from course_lib import yours
    parts = yours.pieces("01", reference={"mul": ..., "tanh": ...})

and gets yours where you passed the check, the course's reference where you did not (or where
`yours.use("01", False)` chose the reference), with one line saying which is which. Before a
saved piece is used, its check runs again, so a piece that has stopped passing is named at
once instead of failing deep inside a later chapter. It runs again once per version of the saved
module and of the check (work/yours/chNN.verified.json remembers which versions passed): some
checks compile kernels for a minute, and code that has not changed cannot have stopped passing.
"""

import contextlib
import hashlib
import importlib
import importlib.util
import io
import json
import sys

from course_lib.checks import CheckFailed
from course_lib.learner import answers

_choice = {}  # chapter -> True (the learner's pieces, the default) or False (the course's)


def use(chapter, yours=True):
    """Choose, for one chapter, the learner's saved pieces (default) or the course's reference."""
    _choice[chapter] = bool(yours)


def load(chapter):
    """The learner's chapter module (work/yours/chNN.py) freshly imported, or None if there is none."""
    path = answers.module_path(chapter)
    if not path.exists():
        return None
    name = f"course_yours_ch{chapter}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _version(chapter):
    """A fingerprint of the saved module (all of the chapter's pieces, as they are loaded) and of the
    check module that passes them."""
    checks = importlib.import_module(f"course_lib.checks.ch{chapter}")
    with open(checks.__file__, "rb") as f:
        return hashlib.sha256(answers.module_path(chapter).read_bytes() + f.read()).hexdigest()


def _verified(chapter):
    path = answers.folder() / f"ch{chapter}.verified.json"
    try:
        return path, json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return path, {}


def _verify(chapter, exercise, args, names=()):
    """Run the exercise's check again on the saved functions; CheckFailed names the piece if they fail."""
    check = getattr(importlib.import_module(f"course_lib.checks.ch{chapter}"), exercise)
    named = [n for n in names if n and n != exercise]
    what = f"`{exercise}` ({', '.join(named)})" if named else f"`{exercise}`"
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            check(*args)
    except CheckFailed as e:
        raise CheckFailed(
            f"your saved {what} ({answers.module_path(chapter)}) fails its check again, so it cannot "
            f"run here. Fix it in your exercise notebook and pass the check, or run "
            f"`yours.use(\"{chapter}\", False)` to use the course's version.\n{e}") from None


def pieces(chapter, reference, verify=True, quiet=False):
    """{name: function} for every name in `reference`: the learner's saved one, else the reference.

    reference: {name: the course's function}. The names are those the exercise asked for.
    Prints one line saying which pieces are the learner's and which are the course's.
    """
    chosen, mine = dict(reference), []
    saved = answers.index(chapter) if _choice.get(chapter, True) else {}
    module = load(chapter) if saved else None
    stamps, passed = _verified(chapter)
    version = _version(chapter) if saved and verify else None
    for exercise, piece in saved.items():
        wanted = [n for n in piece["names"] if n in reference]
        if not wanted:
            continue
        constants = piece.get("constants", {})  # the check's other arguments: a block size, say
        funcs = [getattr(module, n, None) if n else constants.get(str(i)) for i, n in enumerate(piece["names"])]
        if verify and passed.get(exercise) != version:
            _verify(chapter, exercise, funcs, piece["names"])
            passed[exercise] = version
            with contextlib.suppress(OSError):    # a read-only workspace: the check runs each time
                stamps.write_text(json.dumps(passed, indent=1))
        for n, f in zip(piece["names"], funcs):
            if n in reference and f is not None:
                chosen[n] = f
                mine += [n] if n not in mine else []   # a function two checks were given counts once
    if not quiet:
        course = [n for n in reference if n not in mine]
        switched_off = not _choice.get(chapter, True)
        nothing = "your code switched off by yours.use" if switched_off else "none of your code saved yet"
        print(f"chapter {chapter}: " + (f"your {', '.join(mine)}" if mine else nothing)
              + (f"; the course's {', '.join(course)}" if course else "; nothing of the course's"))
    return chosen
