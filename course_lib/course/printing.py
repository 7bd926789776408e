"""What the `course` commands print: lines wrapped to the terminal's width at whole words, and colour
only where a terminal shows it (never in a file or a pipe, nor with NO_COLOR set)."""

import os
import shutil
import sys
import textwrap

GREEN, RED, YELLOW = "32", "31", "33"


def paint(text, colour):
    """`text` in a terminal colour, or as it is when the output is not a terminal (a file, a pipe) or
    NO_COLOR is set (https://no-color.org)."""
    if not sys.stdout.isatty() or os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return text
    return f"\033[{colour}m{text}\033[0m"


def wrap(text, indent="", lines=None):
    """`text` wrapped to the terminal's width under `indent`, whole words only, at most `lines` lines
    (a longer check message says where the rest is; lines=None: no limit)."""
    width = max(60, shutil.get_terminal_size((100, 24)).columns) - len(indent)
    out = []
    for para in text.strip().splitlines():
        out += textwrap.wrap(para, width, break_long_words=False, break_on_hyphens=False,
                             subsequent_indent="    " if para.startswith("  ") else "") or [""]
    if lines is not None and len(out) > lines:
        out = out[:lines] + ["... (the whole message is in the notebook, under the check cell)"]
    return "\n".join(indent + line for line in out)


def say(text, indent="", lines=None, file=None):
    """Print `text` wrapped (see `wrap`), at once."""
    print(wrap(text, indent, lines), file=file or sys.stdout, flush=True)
