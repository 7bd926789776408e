"""Where `make test`'s time goes, from the logs benchmarks/suite_time.sh writes (pytest's `--durations=0`).

    python benchmarks/suite_report.py LABEL=LOG [LABEL=LOG ...] [--durations tests/durations.json]

prints, in Markdown:
- the wall time of each run (its `make test took N s` line) and pytest's own total;
- the 20 slowest items of each run (setup, call and teardown of a test added up), side by side;
- the seconds of each test module and notebook (the 30 slowest), side by side;
- the seconds of each scheduling group (tests/worker_groups.py: a chapter's tests and notebooks, or
  a file), side by side.

--durations PATH writes the groups' seconds of the first run into PATH (tests/durations.json: the order
in which `make test` starts them). Nothing here is timed: the figures are the logs'.
"""

import argparse
import collections
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from worker_groups import group_of  # noqa: E402  (tests/ is not a package)

PHASE = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S.*?)\s*$")
WALL = re.compile(r"make test took (\d+) s")
TOTAL = re.compile(r"^=+ .*\b(?:passed|failed)\b.* in ([\d.]+)s")


def read(log):
    """(wall seconds or None, pytest seconds or None, {test id: seconds})."""
    items = collections.Counter()
    wall = total = None
    for line in Path(log).read_text(errors="replace").splitlines():
        if m := PHASE.match(line):
            items[re.sub(r"@\S+$", "", m.group(3))] += float(m.group(1))
        elif m := WALL.search(line):
            wall = int(m.group(1))
        elif m := TOTAL.match(line):
            total = float(m.group(1))
    return wall, total, items


def by_group(items):
    groups = collections.Counter()
    for test, seconds in items.items():
        groups[group_of(test.split("::")[0])] += seconds
    return groups


def side_by_side(title, labels, columns, rows):
    print(f"\n### {title}\n")
    print("| | " + " | ".join(labels) + " |")
    print("|---|" + "---:|" * len(labels))
    for row in rows:
        print(f"| `{row}` | " + " | ".join(f"{c[row]:.1f}" if row in c else "" for c in columns) + " |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="LABEL=LOG")
    parser.add_argument("--durations", type=Path, help="write the first run's group seconds here")
    args = parser.parse_args(argv)
    labels, runs = zip(*(run.split("=", 1) for run in args.runs))
    read_runs = [read(log) for log in runs]

    print("| run | make test, wall s | pytest s | items timed |\n|---|---:|---:|---:|")
    for label, (wall, total, items) in zip(labels, read_runs):
        print(f"| {label} | {wall if wall is not None else '?'} | {total if total is not None else '?'} | {len(items)} |")

    columns = [items for _, _, items in read_runs]
    slowest = list(dict.fromkeys(t for c in columns for t, _ in c.most_common(20)))
    slowest.sort(key=lambda t: -max(c.get(t, 0) for c in columns))
    side_by_side("The 20 slowest items of each run (seconds: setup + call + teardown)", labels, columns, slowest)

    files = [collections.Counter() for _ in columns]
    for c, f in zip(columns, files):
        for test, seconds in c.items():
            f[test.split("::")[0]] += seconds
    slowest_files = list(dict.fromkeys(name for f in files for name, _ in f.most_common(30)))
    slowest_files.sort(key=lambda n: -max(f.get(n, 0) for f in files))
    side_by_side("Seconds per test module and notebook (the 30 slowest of each run)", labels, files, slowest_files)

    groups = [by_group(c) for c in columns]
    names = sorted(set().union(*groups), key=lambda g: -max(c.get(g, 0) for c in groups))
    side_by_side("Seconds per scheduling group (tests/worker_groups.py)", labels, groups, names)

    if args.durations:
        about = ("Seconds each scheduling group of tests/worker_groups.py took in a cold `make test` on 2 cores "
                 f"(benchmarks/suite_time.sh, run {labels[0]}): the order in which `make test` starts the groups.")
        seconds = {g: round(s, 1) for g, s in groups[0].most_common()}
        args.durations.write_text(json.dumps({"about": about, "seconds": seconds}, indent=1) + "\n")
        print(f"\nwrote {args.durations}")


if __name__ == "__main__":
    main()
