#!/usr/bin/env bash
# How long `make test` takes from a fresh clone, cold and warm, and where the time goes. Run it on an idle
# machine (the figures go into the README and the issue's table); it changes nothing outside its folders.
#
#   benchmarks/suite_time.sh [--write-durations] [--env VAR=VALUE ...] COMMIT [COMMIT ...]
#
# For each commit (a hash, a branch, HEAD), from this clone:
#   cold  `git clone` into a temporary folder, then `make test`: the install included (pip's own cache
#         stays as it is, warm), and every kernel cache empty, as in a clean CI checkout: Numba's (the
#         clone's __pycache__ folders, and IPython's cache folder for notebook functions), the compiler's
#         generated kernels, PyTorch's C++ extensions, matplotlib's font cache;
#   warm  `make test` again in the same clone: installed, every cache full.
# Each run's log (pytest with --durations=0) goes to benchmarks/out/suite_time/<commit>-<cold|warm>.log, and
# benchmarks/suite_report.py prints the wall times, the 20 slowest items, the slowest files and the
# scheduling groups of all runs side by side (also saved as benchmarks/out/suite_time/report.md).
#
#   --write-durations   write the groups' seconds of the first commit's cold run into tests/durations.json
#                       (the order in which `make test` starts its groups)
#   --env VAR=VALUE     set VAR for every run (e.g. --env NUMBA_NUM_THREADS=4)
#
# Before and after, cold and warm, on an idle machine (about an hour for two commits):
#   benchmarks/suite_time.sh main infra
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="$here/benchmarks/out/suite_time"
mkdir -p "$out"
write_durations=""
envs=()
commits=()
while [ $# -gt 0 ]; do
  case "$1" in
    --write-durations) write_durations=1 ;;
    --env) envs+=("$2"); shift ;;
    *) commits+=("$1") ;;
  esac
  shift
done
[ ${#commits[@]} -gt 0 ] || { sed -n '2,22p' "$0"; exit 2; }

pip_cache="$(python3 -m pip cache dir 2>/dev/null || echo "$HOME/.cache/pip")"
runs=()
for commit in "${commits[@]}"; do
  hash="$(git -C "$here" rev-parse --short "$commit")"
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/suite-time-$hash-XXXX")"
  git clone -q "$here" "$tmp/clone"
  git -C "$tmp/clone" checkout -q "$hash"
  # the caches a run fills, all inside $tmp; pip's stays where it is
  cache_env=(XDG_CACHE_HOME="$tmp/cache" PIP_CACHE_DIR="$pip_cache" COURSE_COMPILER_CACHE="$tmp/cache/course_lib/compiler"
             TORCH_EXTENSIONS_DIR="$tmp/cache/torch_extensions" MPLCONFIGDIR="$tmp/cache/matplotlib" IPYTHONDIR="$tmp/ipython")
  for mode in cold warm; do
    log="$out/$hash-$mode.log"
    echo "== $commit ($hash), $mode: $log"
    start=$(date +%s)
    set +e
    (cd "$tmp/clone" && env "${cache_env[@]}" ${envs[@]+"${envs[@]}"} make test PYTEST_ARGS="--durations=0 --durations-min=0") > "$log" 2>&1
    status=$?
    set -e
    echo "make test took $(( $(date +%s) - start )) s (exit $status)" | tee -a "$log"
    tail -n 3 "$log" | head -n 1
    runs+=("$hash-$mode=$log")
  done
  rm -rf "$tmp"
done

report=("$here/.venv/bin/python" "$here/benchmarks/suite_report.py" "${runs[@]}")
[ -z "$write_durations" ] || report+=(--durations "$here/tests/durations.json")
"${report[@]}" | tee "$out/report.md"
