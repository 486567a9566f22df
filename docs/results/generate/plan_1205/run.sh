#!/bin/bash
# benchmarks/step_ops_ab.py three times (each: 7 interleaved rounds of 400 calls per side and pair), from the
# repository root:  OMP_NUM_THREADS=1 PYTHONPATH=$PWD bash docs/results/generate/plan_1205/run.sh [<record folder>]
R=$(cd "${1:-$(dirname "$0")}" && pwd)
export OMP_NUM_THREADS=1
git rev-parse --short HEAD > $R/commit.txt
for i in 1 2 3; do
  echo "$(date -u +%T) start ops_$i load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
  nice -n 5 python -m benchmarks.step_ops_ab --json $R/ops_$i.json > $R/ops_$i.txt 2>&1
  echo "$(date -u +%T) end ops_$i rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
done
