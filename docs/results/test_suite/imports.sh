#!/usr/bin/env bash
# CPU (user+sys) and wall of importing what a train.py process imports, 3 repeats each.
cd /work/wt/suite
for i in 1 2 3; do
  for m in torch torch.distributed.tensor datasets moe.config moe.train; do
    echo "$m $(cat /proc/loadavg | cut -d' ' -f1) $( { PYTHONPATH=$PWD /usr/bin/time -f '%e %U %S' python -c "import $m" ; } 2>&1 | tail -1)"
  done
done
