#!/usr/bin/env bash
# seed-0 analysis x3, seed-1 analysis x1, serially; load and wall time of each step logged
cd /work/wt/ea
export PYTHONPATH=/work/wt/ea MOE_LAB_DATA=/work/shared/data
L=/work/ea/loadlog.txt
for job in "0 1" "0 2" "0 3" "1 1"; do
  set -- $job
  while [ "$1" = 1 ] && ! grep -q "train1 end" $L; do sleep 20; done
  echo "analysis seed$1 rep$2 start $(date -u +%FT%TZ) $(cat /proc/loadavg)" >> $L
  t0=$(date +%s.%N)
  docs/results/expert_analysis/run.sh analysis $1 $2 > /work/ea/analysis_seed$1_rep$2.log 2>&1
  rc=$?
  t1=$(date +%s.%N)
  echo "analysis seed$1 rep$2 end rc=$rc wall_s=$(echo "$t1 - $t0" | bc) $(date -u +%FT%TZ) $(cat /proc/loadavg)" >> $L
done
