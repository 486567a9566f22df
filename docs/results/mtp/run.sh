#!/usr/bin/env bash
# issue 36 item 4, reduced to the default `tiny` model (what fits a session's quiet machine)
set -u
cd /work/main
for S in 0 1; do
  { date -u; uptime; } >> /tmp/mtp/loads.txt
  /usr/bin/time -f "%e wall %U user %S sys" python train.py logger=none hydra.run.dir=/tmp/mtp/off_s$S seed=$S > /tmp/mtp/off_s$S.log 2>&1
  /usr/bin/time -f "%e wall %U user %S sys" python train.py logger=none model.mtp_depth=1 train.mtp_loss_coef=0.3 train.mtp_loss_coef_after=0.1 train.mtp_loss_switch_step=133 hydra.run.dir=/tmp/mtp/on_s$S seed=$S > /tmp/mtp/on_s$S.log 2>&1
done
{ date -u; uptime; } >> /tmp/mtp/loads.txt
echo DONE >> /tmp/mtp/loads.txt
