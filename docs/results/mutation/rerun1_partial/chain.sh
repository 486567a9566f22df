#!/bin/bash
cd /work/mut_mutR/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutR
unset PYTHONPATH
for m in loglik:eval.loglik. sdpa:moe.attention.sdpa. eager:moe.attention.eager. loss:moe.loss. scheduler:moe.engine.core.scheduler.; do
  n=${m%%:*}; p=${m#*:}
  echo "$(date -u +%H:%M:%S) start $n $(cat /proc/loadavg)" >> /tmp/mutR_loadavg_chain.txt
  nice -n 5 python drive.py run_drive_$n.json "$p" 2> /tmp/mutR_drive_$n.err > /tmp/mutR_drive_$n.out
  echo "$(date -u +%H:%M:%S) end $n rc=$? $(cat /proc/loadavg)" >> /tmp/mutR_loadavg_chain.txt
done
