#!/bin/bash
# Two more invocations of run.sh's five generate commands at torch's default threads (2 here), so that each of
# issue 32's end-to-end ratios has three invocations (run.sh's is the first). Run from the repository root:
#   bash docs/results/generate/floor_1205/rerun.sh
R=$(cd "$(dirname "$0")" && pwd)
export WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=2
SMALL="--d-model 512 --n-layers 8 --n-heads 8 --n-kv-heads 4 --n-experts 8 --expert-hidden 768"
echo "rerun at $(git rev-parse --short HEAD)" >> $R/commit.txt
run() { # name cmd...
  name=$1; shift
  [ -e $R/$name.txt ] && { echo "error: $R/$name.txt exists" >&2; exit 2; }
  echo "$(date -u +%T) start $name load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
  PYTHONPATH=$PWD /usr/bin/time -f "%e s wall %U user %S sys" python "$@" > $R/$name.txt 2>&1
  echo "$(date -u +%T) end $name rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
}
for i in 2 3; do
  run small_b1_t2_$i -m benchmarks.generate $SMALL --compile --num-prompts 6 --max-num-seqs 1 --hf sequential --repeats 3 --json $R/small_b1_t2_$i.json
  run tiny_b1_t2_$i -m benchmarks.generate --compile --num-prompts 8 --max-num-seqs 1 --hf sequential --repeats 3 --json $R/tiny_b1_t2_$i.json
  run tiny_b8_t2_$i -m benchmarks.generate --compile --hf none --max-num-seqs 8 --num-prompts 16 --repeats 3 --json $R/tiny_b8_t2_$i.json
  run small_b8_t2_$i -m benchmarks.generate $SMALL --compile --hf none --max-num-seqs 8 --num-prompts 16 --repeats 3 --json $R/small_b8_t2_$i.json
  run p32_t2_$i -m benchmarks.generate --num-prompts 32 --hf batched --hf-batch-sizes 8 0 --repeats 3 --json $R/p32_t2_$i.json
done
