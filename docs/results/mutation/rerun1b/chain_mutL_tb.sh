#!/bin/bash
# rerun1b continued (mutL): the second half of eval/tasks/truthfulqa.py (from mc1_score on, in file order), beside
# chain_mutL_t.sh (which takes the module from its start); run_drive_truthfulqa_b.json; stopped at the session's stop
cd /work/mut_mutL/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutL
unset PYTHONPATH
T=eval.tasks.truthfulqa.
echo "$(date -u +%H:%M:%S) start truthfulqa (b: mc1_score on) $(cat /proc/loadavg)" >> /tmp/mutL_loadavg_chain.txt
nice -n 19 python drive.py run_drive_truthfulqa_b.json "${T}x_mc1_score_" "${T}x_mc2_score_" "${T}x_score_docs_" \
  "${T}xǁHarnessEncoderǁ" "${T}x_build_requests_" "${T}x_evaluate_" "${T}xǁTruthfulQAǁ" "${T}x__fmt_" \
  2> /tmp/mutL_drive_truthfulqa_b.err > /tmp/mutL_drive_truthfulqa_b.out
echo "$(date -u +%H:%M:%S) end truthfulqa (b) rc=$? $(cat /proc/loadavg)" >> /tmp/mutL_loadavg_chain.txt
