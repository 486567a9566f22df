#!/usr/bin/env bash
# usage: files.sh <repo-root> <out-file> <test files...>: one pytest run of the files, --durations=0, wall + CPU.
root=$1; out=$2; shift 2
cd "$root"
{ echo "# files: $*"; echo "# tree: $root at $(git -C "$root" rev-parse --short HEAD 2>/dev/null || cat "$root/.commit")";
  echo "# command: CI=true MOE_LAB_DATA=/work/shared/data PYTHONPATH=\$PWD python -m pytest -q -p no:cacheprovider --durations=0 $*";
  echo "# start: $(date -u +%FT%TZ) loadavg: $(cat /proc/loadavg)"; } > "$out"
CI=true MOE_LAB_DATA=/work/shared/data PYTHONPATH=$PWD /usr/bin/time -f "# time: wall=%e s user=%U s sys=%S s rc=%x" \
  timeout 2400 python -m pytest -q -p no:cacheprovider --durations=0 "$@" >> "$out" 2>&1
echo "# end: $(date -u +%FT%TZ) loadavg: $(cat /proc/loadavg)" >> "$out"
