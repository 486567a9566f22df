#!/bin/bash
# rerun2, continued (mutF), after chain_c.sh finished early: the 35 TruthfulQA loading mutants left
# unrun (load_docs #52-#86; drive.py resumes the partial run_drive_truthfulqa.json), same environment
cd /work/mut_mutD/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutF
unset PYTHONPATH
export PYTEST_ADDOPTS="--deselect tests/engine/sampling/test_guided.py::test_outputs_match_their_regex_choice_grammar_and_schema"
T=eval.tasks.truthfulqa
echo "$(date -u +%H:%M:%S) start truthfulqa $(cat /proc/loadavg)" >> /tmp/mutF_loadavg_chain.txt
python drive.py run_drive_truthfulqa.json $T.x_load_docs__ $T.x__rows_from_dir__ $T.x__categories__ $T.x__targets__ 2> /tmp/mutF_drive_truthfulqa.err > /tmp/mutF_drive_truthfulqa.out
echo "$(date -u +%H:%M:%S) end truthfulqa rc=$? $(cat /proc/loadavg)" >> /tmp/mutF_loadavg_chain.txt
