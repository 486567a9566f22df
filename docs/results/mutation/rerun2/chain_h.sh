#!/bin/bash
# rerun2, continued (mutM): the tail of moe/checkpoint.py beside chain_g.sh's driver (which takes the
# module in file order), so that more whole functions run before the hard stop: resolve_checkpoint and
# tokenizer_files, then page_releaser; same tree, driver, selection, deselected test and environment, nice 19.
# Its verdicts go to run_drive_checkpoint_tail.json; chain_g.sh's driver is stopped when it reaches page_releaser.
cd /work/mut_mutD/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutM
unset PYTHONPATH
export PYTEST_ADDOPTS="--deselect tests/engine/sampling/test_guided.py::test_outputs_match_their_regex_choice_grammar_and_schema"
L=/tmp/mutM_loadavg_chain.txt
echo "$(date -u +%H:%M:%S) start checkpoint tail (resolve_checkpoint, tokenizer_files) $(cat /proc/loadavg)" >> $L
nice -n 19 python drive.py run_drive_checkpoint_tail.json moe.checkpoint.x_resolve_checkpoint__ moe.checkpoint.x_tokenizer_files__ 2> /tmp/mutM_drive_tail.err > /tmp/mutM_drive_tail.out
echo "$(date -u +%H:%M:%S) end checkpoint tail part 1 rc=$?, start page_releaser $(cat /proc/loadavg)" >> $L
nice -n 19 python drive.py run_drive_checkpoint_tail.json moe.checkpoint.x_resolve_checkpoint__ moe.checkpoint.x_tokenizer_files__ moe.checkpoint.x_page_releaser__ 2>> /tmp/mutM_drive_tail.err >> /tmp/mutM_drive_tail.out
echo "$(date -u +%H:%M:%S) end checkpoint tail rc=$? $(cat /proc/loadavg)" >> $L
