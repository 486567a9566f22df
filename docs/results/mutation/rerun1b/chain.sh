#!/bin/bash
# rerun1b (mutB): every mutant of the seven modules through ../run4_features/drive.py, one module after another
cd /work/mut_mutB/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutB
unset PYTHONPATH
for m in paged_torch:moe.attention.paged_torch. block_manager:moe.engine.memory.block_manager. \
         reference:kernels.paged_attention.reference. rope:moe.rope. base:moe.routing.routers.base. \
         sampler:moe.engine.sampling.sampler. truthfulqa:eval.tasks.truthfulqa.; do
  n=${m%%:*}; p=${m#*:}
  echo "$(date -u +%H:%M:%S) start $n $(cat /proc/loadavg)" >> /tmp/mutB_loadavg_chain.txt
  nice -n 10 python drive.py run_drive_$n.json "$p" 2> /tmp/mutB_drive_$n.err > /tmp/mutB_drive_$n.out
  echo "$(date -u +%H:%M:%S) end $n rc=$? $(cat /proc/loadavg)" >> /tmp/mutB_loadavg_chain.txt
done
