#!/bin/bash
# rerun2, continued (mutF), after chain_c.sh and chain_d.sh finished early: moe/train/resume.py, same environment
cd /work/mut_mutD/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutF
unset PYTHONPATH
export PYTEST_ADDOPTS="--deselect tests/engine/sampling/test_guided.py::test_outputs_match_their_regex_choice_grammar_and_schema"
echo "$(date -u +%H:%M:%S) start resume $(cat /proc/loadavg)" >> /tmp/mutF_loadavg_chain.txt
python drive.py run_drive_resume.json moe.train.resume. 2> /tmp/mutF_drive_resume.err > /tmp/mutF_drive_resume.out
echo "$(date -u +%H:%M:%S) end resume rc=$? $(cat /proc/loadavg)" >> /tmp/mutF_loadavg_chain.txt
