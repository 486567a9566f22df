#!/usr/bin/env bash
# usage: measure.sh <repo-root> <outdir> <targets...>: each target's pytest run with --durations=60,
# wall and CPU (user+sys of pytest and every process it waited for) from GNU time, and the load.
root=$1; out=$2; shift 2
cd "$root"
for t in "$@"; do
  name=$(echo "$t" | tr '/' '_' | sed 's/\.py$//')
  { echo "# target: $t"; echo "# tree: $root at $(git -C "$root" rev-parse --short HEAD 2>/dev/null || cat "$root/.commit")";
    echo "# command: CI=true MOE_LAB_DATA=/work/shared/data PYTHONPATH=\$PWD python -m pytest -q -p no:cacheprovider --durations=60 $t";
    echo "# start: $(date -u +%FT%TZ) loadavg: $(cat /proc/loadavg)"; } > "$out/$name.txt"
  CI=true MOE_LAB_DATA=/work/shared/data PYTHONPATH=$PWD /usr/bin/time -f "# time: wall=%e s user=%U s sys=%S s rc=%x" \
    timeout 2400 python -m pytest -q -p no:cacheprovider --durations=60 "$t" >> "$out/$name.txt" 2>&1
  echo "# end: $(date -u +%FT%TZ) loadavg: $(cat /proc/loadavg)" >> "$out/$name.txt"
done
