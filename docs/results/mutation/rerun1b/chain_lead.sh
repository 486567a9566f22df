#!/bin/bash
# rerun1b continued (lead): base.py's two drivers restarted on their jsons (drive.py skips mutants with a verdict)
cd /work/mut_mutB/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
unset PYTHONPATH
run() {
  echo "$(date -u +%H:%M:%S) start $1 $(cat /proc/loadavg)" >> /tmp/lead/loadavg_chain_lead.txt
  MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-lead-$1 python drive.py run_drive_$1.json "$2" 2> /tmp/lead/drive_$1.err > /tmp/lead/drive_$1.out
  echo "$(date -u +%H:%M:%S) end $1 rc=$? $(cat /proc/loadavg)" >> /tmp/lead/loadavg_chain_lead.txt
}
run base_methods "moe.routing.routers.base.xǁ" &
run base_functions "moe.routing.routers.base.x_" &
wait
