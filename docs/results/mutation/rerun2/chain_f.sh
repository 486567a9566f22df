#!/bin/bash
# rerun2, continued (mutM): the rest of moe/train/resume.py (drive.py resumes the 186 verdicts left in the
# tree), then moe/checkpoint.py in full; same tree, driver, selection, deselected test and environment, at nice 19
cd /work/mut_mutD/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutM
unset PYTHONPATH
export PYTEST_ADDOPTS="--deselect tests/engine/sampling/test_guided.py::test_outputs_match_their_regex_choice_grammar_and_schema"
L=/tmp/mutM_loadavg_chain.txt
echo "$(date -u +%H:%M:%S) start resume (rest) $(cat /proc/loadavg)" >> $L
nice -n 19 python drive.py run_drive_resume.json moe.train.resume. 2> /tmp/mutM_drive_resume.err > /tmp/mutM_drive_resume.out
echo "$(date -u +%H:%M:%S) end resume rc=$? $(cat /proc/loadavg)" >> $L
echo "$(date -u +%H:%M:%S) start checkpoint $(cat /proc/loadavg)" >> $L
nice -n 19 python drive.py run_drive_checkpoint.json moe.checkpoint. 2> /tmp/mutM_drive_checkpoint.err > /tmp/mutM_drive_checkpoint.out
echo "$(date -u +%H:%M:%S) end checkpoint rc=$? $(cat /proc/loadavg)" >> $L
