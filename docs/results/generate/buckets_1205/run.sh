#!/bin/bash
# The CPU's compiled decode step above batch 8 (cpu_max_batch 8 -> 32, batch buckets 1, 2, 4, then multiples of
# 8): the step against the eager one at batch 16, 32 (and 64, the bound raised by floor_max64.py), then issue 32's
# 32-prompt workload with --compile on both models, this checkout (NEW) and the tree before (OLD: d10d2c4,
# `git worktree add <OLD> d10d2c4`), interleaved, three invocations each. Run from the repository root, on a quiet
# machine:  bash docs/results/generate/buckets_1205/run.sh <OLD checkout>
R=$(cd "$(dirname "$0")" && pwd); NEW=$PWD; OLD=$(cd "$1" && pwd)
export WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
SMALL="--d-model 512 --n-layers 8 --n-heads 8 --n-kv-heads 4 --n-experts 8 --expert-hidden 768"
echo "new $(git -C $NEW rev-parse --short HEAD) (+ working tree: $(git -C $NEW status --short | wc -l) changed) old $(git -C $OLD rev-parse --short HEAD)" > $R/commit.txt
run() { # name tree cmd...
  name=$1; tree=$2; shift 2
  [ -e $R/$name.txt ] && { echo "error: $R/$name.txt exists" >&2; exit 2; }
  echo "$(date -u +%T) start $name load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
  (cd $tree && PYTHONPATH=$tree /usr/bin/time -f "%e s wall %U user %S sys" python "$@" > $R/$name.txt 2>&1)
  echo "$(date -u +%T) end $name rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
}
run floor_new $NEW -m benchmarks.decode_floor --batches 16 32 --repeats 3 --json $R/floor_new.json
run floor_old $OLD -m benchmarks.decode_floor --batches 16 32 --repeats 3 --json $R/floor_old.json
run floor_max64 $NEW $R/floor_max64.py --batches 64 --repeats 3 --steps 15 --json $R/floor_max64.json
for i in 1 2 3; do
  for m in tiny small; do
    args="--compile --num-prompts 32 --hf batched --hf-batch-sizes 8 0 --repeats 3"
    [ $m = small ] && args="$SMALL $args"
    for arm in new old; do
      tree=$NEW; [ $arm = old ] && tree=$OLD
      run p32_${m}_${arm}_$i $tree -m benchmarks.generate $args --json $R/p32_${m}_${arm}_$i.json
    done
  done
done
