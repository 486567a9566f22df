#!/bin/bash
# rerun1b continued (lead): once the first driver (chain_lead_t1.sh) is done, TruthfulQA.run's remaining mutants
# are split over two drivers: the second driver is stopped (its file keeps every verdict written) and restarted
# on the mutants numbered 1, 10-19, 100-199 (run_drive_truthfulqa_b.json); a third takes 2-9, 20-99, 200-246
# (run_drive_truthfulqa_c.json)
cd /work/mut_mutL/mutants
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
unset PYTHONPATH
while pgrep -f "drive.py run_drive_truthfulqa.json" > /dev/null; do sleep 5; done
pkill -f "drive.py run_drive_truthfulqa_b.json"; sleep 3
R="eval.tasks.truthfulqa.xǁTruthfulQAǁrun__mutmut_"
echo "$(date -u +%H:%M:%S) split: b restarted on run 1,10-19,100-199; c on the rest $(cat /proc/loadavg)" >> /tmp/lead_loadavg_chain_t.txt
(MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutL2 python drive.py run_drive_truthfulqa_b.json "${R}1" \
  2>> /tmp/lead_drive_truthfulqa_b.err >> /tmp/lead_drive_truthfulqa_b.out;
 echo "$(date -u +%H:%M:%S) end truthfulqa (lead b, split) $(cat /proc/loadavg)" >> /tmp/lead_loadavg_chain_t.txt) &
MOE_TEST_TINY_RUN_CACHE=/tmp/moe-tiny-run-mutL python drive.py run_drive_truthfulqa_c.json "${R}2" "${R}3" "${R}4" "${R}5" \
  "${R}6" "${R}7" "${R}8" "${R}9" 2> /tmp/lead_drive_truthfulqa_c.err > /tmp/lead_drive_truthfulqa_c.out
echo "$(date -u +%H:%M:%S) end truthfulqa (lead c) $(cat /proc/loadavg)" >> /tmp/lead_loadavg_chain_t.txt
wait
