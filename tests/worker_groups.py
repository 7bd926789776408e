"""How `make test` shares the tests between its two workers (pytest-xdist, `-n 2 --dist loadfile`, which
tests/conftest.py turns into `GroupScheduling`): one worker runs a group from its first test to its last,
and the groups start in the order of the collection. So:

- a chapter's test modules and notebooks (test_chNN_*.py, test_yours_chNN.py, notebooks/NN_*,
  exercises/NN_*) form one group, "chNN": the chapter's kernels compile once, in one process, and its
  notebooks' kernels then load them from Numba's cache on disk, instead of compiling them at the same
  time on the other core; every other file is a group of its own, as under plain `--dist loadfile`;
- a group starts with its solved exercise notebook (staged as exercises/NN_*), whose passing checks
  save the answers that the chapter's carried-forward tests then copy (tests/carried.py);
- the groups start longest first, by the seconds tests/durations.json gives them (a cold `make test`,
  measured by benchmarks/suite_time.sh; a group it does not list counts as UNLISTED seconds), so that
  the last group to end is a short one and both cores stay busy to the end.
"""

import json
import re
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

CHAPTER = re.compile(r"(?:tests/test_(?:yours_)?ch|/(?:notebooks|exercises)/)(\d\d)[_.]")
DURATIONS = Path(__file__).with_name("durations.json")
UNLISTED = 5.0


def group_of(path):
    """The group of a test file, given as in a test's id (relative to the repository)."""
    m = CHAPTER.search("/" + path)
    return f"ch{m.group(1)}" if m else path


def seconds():
    return json.loads(DURATIONS.read_text())["seconds"] if DURATIONS.exists() else {}


def longest_first(items):
    """The collected items, their groups longest first, each group's solution notebook first (the items of a
    file keep their order)."""
    known = seconds()
    files = [item.nodeid.split("::")[0] for item in items]
    key = [(-known.get(group_of(f), UNLISTED), "/exercises/" not in "/" + f) for f in files]
    return [items[k] for k in sorted(range(len(items)), key=lambda k: key[k])]


class GroupScheduling(LoadScopeScheduling):
    """xdist's `--dist loadfile` with a chapter's files as one unit of work, handed out in the order of the
    collection (which `longest_first` made), not xdist's default (the units with the most tests first)."""

    def __init__(self, config, log=None):
        super().__init__(config, log)
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid):
        return group_of(nodeid.split("::")[0])
