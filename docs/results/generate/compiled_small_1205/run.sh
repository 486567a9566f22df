#!/bin/bash
# Issue 32's batch-1 target on the `small` shape with the compiled decode step (`LLM(compile=True)`): the eager
# engine, the compiled engine and HF generate() one prompt at a time, the workload of quiet_1205b's small_b1
# runs, three invocations of three timed repeats each. Run from the repository root on a quiet machine:
#   OMP_NUM_THREADS=1 PYTHONPATH=$PWD bash docs/results/generate/compiled_small_1205/run.sh
R=$(cd "$(dirname "$0")" && pwd)
export WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
SMALL="--d-model 512 --n-layers 8 --n-heads 8 --n-kv-heads 4 --n-experts 8 --expert-hidden 768"
git rev-parse --short HEAD > $R/commit.txt
for i in 1 2 3; do
  [ -e $R/small_b1_compiled_$i.json ] && { echo "error: $R/small_b1_compiled_$i.json exists" >&2; exit 2; }
  echo "$(date -u +%T) start $i load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
  /usr/bin/time -f "%e s wall %U user %S sys" python -m benchmarks.generate $SMALL --compile --num-prompts 6 \
      --max-num-seqs 1 --hf sequential --threads 1 --repeats 3 --json $R/small_b1_compiled_$i.json > $R/small_b1_compiled_$i.txt 2>&1
  echo "$(date -u +%T) end $i rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
done
