cd /work/wt/mtp
export OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data WANDB_MODE=offline HF_HUB_OFFLINE=1 PYTHONPATH=/work/wt/mtp
OUT=/tmp/mtp36/train
COMMON="logger=none model.d_model=256 model.expert_hidden=256 train.max_steps=300 train.eval_interval=100 train.log_interval=10 train.ckpt_interval=300"
MTP="model.mtp_depth=1 train.mtp_loss_coef=0.3 train.mtp_loss_coef_after=0.1 train.mtp_loss_switch_step=200"
S=1
{ date -u; cat /proc/loadavg; } >> "$OUT/loads.txt"
nice -n 10 /usr/bin/time -o "$OUT/off_s$S.time" -f "%e wall %U user %S sys" python train.py $COMMON seed=$S hydra.run.dir="$OUT/off_s$S" > "$OUT/off_s$S.log" 2>&1 &
nice -n 10 /usr/bin/time -o "$OUT/on_s$S.time" -f "%e wall %U user %S sys" python train.py $COMMON $MTP seed=$S hydra.run.dir="$OUT/on_s$S" > "$OUT/on_s$S.log" 2>&1 &
wait
{ date -u; cat /proc/loadavg; echo DONE; } >> "$OUT/loads.txt"
