#!/bin/bash
# rerun1b continued (mutL): eval/tasks/truthfulqa.py from its start, begun once sampler.py had every verdict
# (07:49 UTC), stopped by hand at the session's 08:05 stop; run_drive_truthfulqa.json
cd /work/mut_mutL/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutL
unset PYTHONPATH
echo "$(date -u +%H:%M:%S) start truthfulqa $(cat /proc/loadavg)" >> /tmp/mutL_loadavg_chain.txt
nice -n 19 python drive.py run_drive_truthfulqa.json "eval.tasks.truthfulqa." 2> /tmp/mutL_drive_truthfulqa.err > /tmp/mutL_drive_truthfulqa.out
echo "$(date -u +%H:%M:%S) end truthfulqa rc=$? $(cat /proc/loadavg)" >> /tmp/mutL_loadavg_chain.txt
