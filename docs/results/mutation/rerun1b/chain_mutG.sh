#!/bin/bash
# rerun1b continued (mutG): moe/rope.py then kernels/paged_attention/reference.py (then the rest of block_manager)
# through ../run4_features/drive.py in mutB's run directory (mutants and stats made at 433c7b3)
cd /work/mut_mutB/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutG
unset PYTHONPATH
for m in rope:moe.rope. reference:kernels.paged_attention.reference. block_manager:moe.engine.memory.block_manager.; do
  n=${m%%:*}; p=${m#*:}
  echo "$(date -u +%H:%M:%S) start $n $(cat /proc/loadavg)" >> /tmp/mutG_loadavg_chain.txt
  python drive.py run_drive_$n.json "$p" 2> /tmp/mutG_drive_$n.err > /tmp/mutG_drive_$n.out
  echo "$(date -u +%H:%M:%S) end $n rc=$? $(cat /proc/loadavg)" >> /tmp/mutG_loadavg_chain.txt
done
