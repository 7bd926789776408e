"""How the tests compare code with an answer: significant lines, and their shape with local names numbered.

An answer is the significant lines of a solution region: stripped, without comments, blank lines or
trivial lines such as `return out`. Two pieces of code hold the same answer when 3 consecutive
significant lines of one have the same token sequence as 3 consecutive lines of the other once every
local name is replaced by a placeholder numbered in order of appearance (`total = total + v` and
`acc = acc + x` both read `_0 = _0 + _1`). Attribute names, keywords, builtins and common modules stay
as they are, so `x.sum()` and `x.mean()` differ, and windows of fewer than 24 tokens say too little to
count. tests/test_teaching.py compares answers with lessons this way, tests/test_answer_key.py with the
library.
"""

import builtins
import io
import keyword
import re
import tokenize

TRIVIAL = re.compile(r"^(return\s*\w*|pass|else:|try:|break|continue|[)\]}]+|out\s*=\s*\[\]|.{0,12})$")
REGION = re.compile(r"### BEGIN SOLUTION[^\n]*\n(.*?)^[ \t]*### END SOLUTION", re.S | re.M)
MIN_TOKENS = 24   # a window of 3 lines this short (`a = b`, `c = d`, `return e`) says nothing about an answer
KEPT = set(dir(builtins)) | set(keyword.kwlist) | {"np", "torch", "F", "nn", "math", "cuda", "numba", "dist",
                                                    "self", "ctx", "prange", "njit", "ct", "optim", "plt"}


def normalize(line, code=True):
    """One line as compared: comment dropped (code), whitespace folded, backticks stripped."""
    if code:
        line = "" if line.strip().startswith("#") else re.split(r"\s#(?:\s|$)", line, maxsplit=1)[0]
    return re.sub(r"\s+", " ", line).strip().strip("`").strip()


def significant(text):
    lines = (normalize(line) for line in text.splitlines())
    return [s for s in lines if s and not TRIVIAL.match(s)]


def shape_of(line):
    """The line's tokens with local names marked as names; None if the line does not tokenize on its own
    (the middle of a bracket)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    out, after_dot = [], False
    for t in tokens:
        if t.type in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT,
                      tokenize.COMMENT):
            continue
        if t.type == tokenize.NAME and not after_dot and t.string not in KEPT:
            out.append(("name", t.string))
        elif t.type == tokenize.STRING:
            out.append(("str", ""))
        else:
            out.append(("tok", t.string))
        after_dot = t.string == "."
    return out


def rename(window):
    """One token sequence for a window of lines, its names numbered in order of first appearance."""
    seen, out = {}, []
    for line in window:
        for kind, text in line:
            out.append(f"_{seen.setdefault(text, len(seen))}" if kind == "name" else text)
        out.append("\n")
    return tuple(out)


def shapes(lines, k=3, parsed=None):
    """{renamed token sequence of k consecutive lines: index of the window's first line}."""
    parsed = [shape_of(s) for s in lines] if parsed is None else parsed
    found = {}
    for i in range(len(lines) - k + 1):
        window = parsed[i:i + k]
        if any(w is None for w in window) or sum(len(w) for w in window) < MIN_TOKENS:
            continue
        found.setdefault(rename(window), i)
    return found


SCAFFOLDING = re.compile(r"^(for \w+ in p?range\([^()]*\):|(\w+, )+\w+ = [\w.]+\.shape(\[[^\]]*\])?)$")


def scaffolding(line):
    """A line every kernel of its kind writes, which says nothing about an answer on its own: a loop
    header over a range, or the unpacking of a shape."""
    return bool(SCAFFOLDING.match(line))
