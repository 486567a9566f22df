#!/bin/bash
# rerun1b continued (mutK), third script: moe/routing/routers/base.py in two halves, each through
# ../run4_features/drive.py on its own json, started as this session's earlier drivers end (so that at
# most two of its drivers run at once): the methods (prefix "...base.xǁ": RouterConfig, GroupLimitedConfig,
# Router) once block_manager's driver (pid $1) has exited, the module-level functions (prefix
# "...base.x_") once reference's (pid $2) has. chain_mutK_b.sh's loop was stopped at 06:45 UTC, after
# starting reference, so that base would not start there as one driver. The two jsons are merged into
# run_drive_base.json for summarize.py (merge_base.py).
cd /work/mut_mutB/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
unset PYTHONPATH
run() {  # after pid $1: drive $2 with prefix $3
  while kill -0 "$1" 2>/dev/null; do sleep 5; done
  echo "$(date -u +%H:%M:%S) end of pid $1; start $2 $(cat /proc/loadavg)" >> /tmp/mutK/loadavg_chain_mutK.txt
  MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutK-$2 nice -n 19 python drive.py run_drive_$2.json "$3" 2> /tmp/mutK/drive_$2.err > /tmp/mutK/drive_$2.out
  echo "$(date -u +%H:%M:%S) end $2 rc=$? $(cat /proc/loadavg)" >> /tmp/mutK/loadavg_chain_mutK.txt
}
run "$1" base_methods "moe.routing.routers.base.xǁ" &
run "$2" base_functions "moe.routing.routers.base.x_" &
wait
