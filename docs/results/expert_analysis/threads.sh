#!/usr/bin/env bash
# Training speed of the same run with OMP_NUM_THREADS=1 vs 2 on this shared 2-core machine:
# 20 steps each, alternating, 3 repeats; tokens/s read from metrics.jsonl (summarize.py).
set -euo pipefail
OUT=${OUT:-/work/ea}
L=$OUT/loadlog.txt
for rep in 1 2 3; do
  for t in 1 2; do
    echo "threads$t rep$rep start $(date -u +%FT%TZ) $(cat /proc/loadavg)" >> $L
    OMP_NUM_THREADS=$t WANDB_MODE=offline HF_HUB_OFFLINE=1 nice -n 5 python train.py data=text \
      data.path="$OUT/corpus/mix.jsonl" train.max_steps=20 train.ckpt_interval=1000 train.eval_interval=1000 \
      logger=none hydra.run.dir="$OUT/threads20/t${t}_rep$rep" > "$OUT/threads20_t${t}_rep$rep.log" 2>&1
    echo "threads$t rep$rep end $(date -u +%FT%TZ) $(cat /proc/loadavg)" >> $L
  done
done
