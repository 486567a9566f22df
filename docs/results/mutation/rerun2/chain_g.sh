#!/bin/bash
# rerun2, continued (mutM): moe/checkpoint.py, started beside chain_f.sh's resume driver (chain_f.sh's
# script was stopped before its checkpoint step, its resume driver left running) once the first check
# runs were done; same tree, driver, selection, deselected test and environment, at nice 19
cd /work/mut_mutD/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutM
unset PYTHONPATH
export PYTEST_ADDOPTS="--deselect tests/engine/sampling/test_guided.py::test_outputs_match_their_regex_choice_grammar_and_schema"
L=/tmp/mutM_loadavg_chain.txt
while kill -0 "$(cat /tmp/mutM_check1.pid)" 2>/dev/null; do sleep 10; done
echo "$(date -u +%H:%M:%S) start checkpoint $(cat /proc/loadavg)" >> $L
nice -n 19 python drive.py run_drive_checkpoint.json moe.checkpoint. 2> /tmp/mutM_drive_checkpoint.err > /tmp/mutM_drive_checkpoint.out
echo "$(date -u +%H:%M:%S) end checkpoint rc=$? $(cat /proc/loadavg)" >> $L
