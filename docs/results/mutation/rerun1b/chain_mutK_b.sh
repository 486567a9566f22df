#!/bin/bash
# rerun1b continued (mutK), second chain: chain_mutK.sh's loop was stopped (its bash process ended,
# at 06:28 UTC) while its first driver, block_manager's, went on alone; this runs the rest of
# kernels/paged_attention/reference.py then moe/routing/routers/base.py beside it (two drivers of
# this session at a time, each on its own json), as chain_mutK.sh would have after block_manager.
cd /work/mut_mutB/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutK-b
unset PYTHONPATH
for m in reference:kernels.paged_attention.reference. base:moe.routing.routers.base.; do
  n=${m%%:*}; p=${m#*:}
  echo "$(date -u +%H:%M:%S) start $n $(cat /proc/loadavg)" >> /tmp/mutK/loadavg_chain_mutK.txt
  nice -n 19 python drive.py run_drive_$n.json "$p" 2> /tmp/mutK/drive_$n.err > /tmp/mutK/drive_$n.out
  echo "$(date -u +%H:%M:%S) end $n rc=$? $(cat /proc/loadavg)" >> /tmp/mutK/loadavg_chain_mutK.txt
done
