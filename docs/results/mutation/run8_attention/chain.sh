#!/bin/bash
cd /work/mut_mutA/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutA
unset PYTHONPATH
for m in sdpa:moe.attention.sdpa. eager:moe.attention.eager.; do
  n=${m%%:*}; p=${m#*:}
  echo "$(date -u +%H:%M:%S) start $n $(cat /proc/loadavg)" >> /tmp/mutA_loadavg.txt
  nice -n 5 python drive.py run_drive_$n.json "$p" 2> /tmp/mutA_drive_$n.err > /tmp/mutA_drive_$n.out
  echo "$(date -u +%H:%M:%S) end $n rc=$? $(cat /proc/loadavg)" >> /tmp/mutA_loadavg.txt
done
