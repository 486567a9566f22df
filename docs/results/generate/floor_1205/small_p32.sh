#!/bin/bash
# Issue 32's 32-prompt workload on the `small` model at torch's default threads (2 here), three invocations (the
# tiny model's are run.sh's and rerun.sh's p32_t2*). Run from the repository root:
#   bash docs/results/generate/floor_1205/small_p32.sh
R=$(cd "$(dirname "$0")" && pwd)
export WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=2
SMALL="--d-model 512 --n-layers 8 --n-heads 8 --n-kv-heads 4 --n-experts 8 --expert-hidden 768"
echo "small_p32 at $(git rev-parse --short HEAD)" >> $R/commit.txt
for i in "" _2 _3; do
  name=small_p32_t2$i
  [ -e $R/$name.txt ] && { echo "error: $R/$name.txt exists" >&2; exit 2; }
  echo "$(date -u +%T) start $name load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
  PYTHONPATH=$PWD /usr/bin/time -f "%e s wall %U user %S sys" python -m benchmarks.generate $SMALL --num-prompts 32 \
    --hf batched --hf-batch-sizes 8 0 --repeats 3 --json $R/$name.json > $R/$name.txt 2>&1
  echo "$(date -u +%T) end $name rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
done
