#!/bin/bash
# rerun1b continued (lead, 2026-12-05 second session): eval/tasks/truthfulqa.py, the functions before mc1_score
# and TruthfulQA's validate/check_inputs/_fmt, resuming the first driver's file (run_drive_truthfulqa.json in mutants/)
cd /work/mut_mutL/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutL
unset PYTHONPATH
T=eval.tasks.truthfulqa.
echo "$(date -u +%H:%M:%S) start truthfulqa (lead a) $(cat /proc/loadavg)" >> /tmp/lead_loadavg_chain_t.txt
python drive.py run_drive_truthfulqa.json "${T}x__rows_from_dir_" "${T}x_data_dir_" "${T}x_check_added_questions_" \
  "${T}x_load_docs_" "${T}x_select_" "${T}xǁHarnessEncoderǁ" "${T}x_build_requests_" "${T}xǁTruthfulQAǁvalidate_" \
  "${T}xǁTruthfulQAǁcheck_inputs_" "${T}x__fmt_" 2> /tmp/lead_drive_truthfulqa_a.err > /tmp/lead_drive_truthfulqa_a.out
echo "$(date -u +%H:%M:%S) end truthfulqa (lead a) rc=$? $(cat /proc/loadavg)" >> /tmp/lead_loadavg_chain_t.txt
