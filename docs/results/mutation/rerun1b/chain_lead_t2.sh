#!/bin/bash
# rerun1b continued (lead, 2026-12-05 second session): eval/tasks/truthfulqa.py, score_docs' rest, evaluate and
# TruthfulQA.run, resuming the second driver's file (run_drive_truthfulqa_b.json)
cd /work/mut_mutL/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutL2
unset PYTHONPATH
T=eval.tasks.truthfulqa.
echo "$(date -u +%H:%M:%S) start truthfulqa (lead b) $(cat /proc/loadavg)" >> /tmp/lead_loadavg_chain_t.txt
python drive.py run_drive_truthfulqa_b.json "${T}x_score_docs_" "${T}x_evaluate_" "${T}xǁTruthfulQAǁrun_" \
  2> /tmp/lead_drive_truthfulqa_b.err > /tmp/lead_drive_truthfulqa_b.out
echo "$(date -u +%H:%M:%S) end truthfulqa (lead b) rc=$? $(cat /proc/loadavg)" >> /tmp/lead_loadavg_chain_t.txt
