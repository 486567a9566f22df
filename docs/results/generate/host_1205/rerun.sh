#!/bin/bash
# Three more invocations of issue 32's `small` batch-1 command with the compiled engine, at the head of the
# session (after run.sh's A/B): is the 1.3x median a fluke of that run? Run from the repository root:
#   OMP_NUM_THREADS=1 PYTHONPATH=$PWD bash docs/results/generate/host_1205/rerun.sh
R=$(cd "$(dirname "$0")" && pwd)
export WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
SMALL="--d-model 512 --n-layers 8 --n-heads 8 --n-kv-heads 4 --n-experts 8 --expert-hidden 768"
echo "rerun at $(git rev-parse --short HEAD)" >> $R/commit.txt
for i in 1 2 3; do
  name=small_b1_rerun_$i
  [ -e $R/$name.json ] && { echo "error: $R/$name.json exists" >&2; exit 2; }
  echo "$(date -u +%T) start $name load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
  /usr/bin/time -f "%e s wall %U user %S sys" python -m benchmarks.generate $SMALL --compile --num-prompts 6 \
    --max-num-seqs 1 --hf sequential --threads 1 --repeats 3 --json $R/$name.json > $R/$name.txt 2>&1
  echo "$(date -u +%T) end $name rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
done
