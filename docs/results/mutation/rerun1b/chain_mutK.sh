#!/bin/bash
# rerun1b continued (mutK): the rest of moe/engine/memory/block_manager.py, the rest of
# kernels/paged_attention/reference.py, then moe/routing/routers/base.py, through ../run4_features/drive.py
# in mutB's run directory (mutants and stats made at 433c7b3). drive.py goes on where a stopped run
# stopped (it skips the keys its json already holds), so only the not-yet-run mutants are driven.
cd /work/mut_mutB/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutK
unset PYTHONPATH
for m in block_manager:moe.engine.memory.block_manager. reference:kernels.paged_attention.reference. base:moe.routing.routers.base.; do
  n=${m%%:*}; p=${m#*:}
  echo "$(date -u +%H:%M:%S) start $n $(cat /proc/loadavg)" >> /tmp/mutK/loadavg_chain_mutK.txt
  nice -n 19 python drive.py run_drive_$n.json "$p" 2> /tmp/mutK/drive_$n.err > /tmp/mutK/drive_$n.out
  echo "$(date -u +%H:%M:%S) end $n rc=$? $(cat /proc/loadavg)" >> /tmp/mutK/loadavg_chain_mutK.txt
done
