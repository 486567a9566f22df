#!/usr/bin/env bash
# issue 36 item 4 at a mid size (d_model=256, expert_hidden=256: ~10M parameters), between `tiny` and
# `small` (small is ~8.5 s a step on this loaded 2-core machine: 2 seeds x 2 arms of a meaningful run
# do not fit). Two runs at a time, one thread each; each seed's pair (MTP off / on) run side by side.
# Usage: bash run_train.sh OUT_DIR   (run from the repository root)
set -u
OUT=${1:?out dir}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 MOE_LAB_DATA=${MOE_LAB_DATA:-/work/shared/data} WANDB_MODE=offline HF_HUB_OFFLINE=1
COMMON="logger=none model.d_model=256 model.expert_hidden=256 train.max_steps=300 train.eval_interval=100 train.log_interval=10 train.ckpt_interval=300"
MTP="model.mtp_depth=1 train.mtp_loss_coef=0.3 train.mtp_loss_coef_after=0.1 train.mtp_loss_switch_step=200"
for S in 0 1; do
  { date -u; cat /proc/loadavg; } >> "$OUT/loads.txt"
  /usr/bin/time -o "$OUT/off_s$S.time" -f "%e wall %U user %S sys" python train.py $COMMON seed=$S hydra.run.dir="$OUT/off_s$S" > "$OUT/off_s$S.log" 2>&1 &
  /usr/bin/time -o "$OUT/on_s$S.time" -f "%e wall %U user %S sys" python train.py $COMMON $MTP seed=$S hydra.run.dir="$OUT/on_s$S" > "$OUT/on_s$S.log" 2>&1 &
  wait
done
{ date -u; cat /proc/loadavg; echo DONE; } >> "$OUT/loads.txt"
