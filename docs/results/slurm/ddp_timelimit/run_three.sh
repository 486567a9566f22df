#!/bin/bash
cd /work/wt/slurm2
for i in 1 2 3; do
  out=/tmp/slurm2_rec/pytest_output_$i.txt
  { date -u +%FT%TZ; uptime; git log --oneline -1; } > $out
  t0=$(date +%s)
  PYTHONPATH=$PWD MOE_LAB_DATA=/work/shared/data MOE_LAB_SLURM_REQUEUE_TESTS=1 timeout 1500 python -m pytest -q -s -p no:cacheprovider --basetemp=/tmp/slurm2_rec/r$i tests/cluster/test_real_slurm_ddp_timelimit.py --durations=5 >> $out 2>&1
  rc=$?
  { echo "exit=$rc wall=$(( $(date +%s) - t0 ))s"; uptime; } >> $out
done
echo done > /tmp/slurm2_rec/finished
