#!/bin/bash
# rerun1b continued (mutL): moe/engine/sampling/sampler.py then eval/tasks/truthfulqa.py
# through ../run4_features/drive.py in a copy of mutB's run directory (rsync -a /work/mut_mutB/ /work/mut_mutL/:
# the same mutants and stats, made at 433c7b3), at nice 19
cd /work/mut_mutL/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutL
unset PYTHONPATH
for m in sampler:moe.engine.sampling.sampler. truthfulqa:eval.tasks.truthfulqa.; do
  n=${m%%:*}; p=${m#*:}
  echo "$(date -u +%H:%M:%S) start $n $(cat /proc/loadavg)" >> /tmp/mutL_loadavg_chain.txt
  nice -n 19 python drive.py run_drive_$n.json "$p" 2> /tmp/mutL_drive_$n.err > /tmp/mutL_drive_$n.out
  echo "$(date -u +%H:%M:%S) end $n rc=$? $(cat /proc/loadavg)" >> /tmp/mutL_loadavg_chain.txt
done
