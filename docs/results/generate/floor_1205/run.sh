#!/bin/bash
# Issue 32's compiled-vs-eager step against the cost of reading its weights (benchmarks/decode_floor.py), at one
# thread and at torch's default (2 on this CPU), for the tree before this record's two compiled-step changes
# (OLD: 7b02965, `git worktree add <OLD> 7b02965`; the benchmark file copied in, it uses only the engine's public
# API) and after (NEW: this checkout), interleaved; then issue 32's generate commands at the default threads; then
# the two changes' kernel-level A/Bs (attention_layout.py, experts_step.py). Run from the repository root, on a
# quiet machine:  bash docs/results/generate/floor_1205/run.sh <OLD checkout>
R=$(cd "$(dirname "$0")" && pwd); NEW=$PWD; OLD=$(cd "$1" && pwd)
export WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
SMALL="--d-model 512 --n-layers 8 --n-heads 8 --n-kv-heads 4 --n-experts 8 --expert-hidden 768"
cp $NEW/benchmarks/decode_floor.py $OLD/benchmarks/decode_floor.py
echo "new $(git -C $NEW rev-parse --short HEAD) old $(git -C $OLD rev-parse --short HEAD)" > $R/commit.txt
run() { # name tree threads cmd...
  name=$1; tree=$2; nt=$3; shift 3
  [ -e $R/$name.txt ] && { echo "error: $R/$name.txt exists" >&2; exit 2; }
  echo "$(date -u +%T) start $name load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
  (cd $tree && OMP_NUM_THREADS=$nt PYTHONPATH=$tree /usr/bin/time -f "%e s wall %U user %S sys" python "$@" > $R/$name.txt 2>&1)
  echo "$(date -u +%T) end $name rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
}
for nt in 1 2; do
  for arm in new old; do
    tree=$NEW; [ $arm = old ] && tree=$OLD
    run floor_t${nt}_$arm $tree $nt -m benchmarks.decode_floor --threads $nt --repeats 3 --json $R/floor_t${nt}_$arm.json
  done
done
run small_b1_t2 $NEW 2 -m benchmarks.generate $SMALL --compile --num-prompts 6 --max-num-seqs 1 --hf sequential --repeats 3 --json $R/small_b1_t2.json
run tiny_b1_t2 $NEW 2 -m benchmarks.generate --compile --num-prompts 8 --max-num-seqs 1 --hf sequential --repeats 3 --json $R/tiny_b1_t2.json
run tiny_b8_t2 $NEW 2 -m benchmarks.generate --compile --hf none --max-num-seqs 8 --num-prompts 16 --repeats 3 --json $R/tiny_b8_t2.json
run small_b8_t2 $NEW 2 -m benchmarks.generate $SMALL --compile --hf none --max-num-seqs 8 --num-prompts 16 --repeats 3 --json $R/small_b8_t2.json
run p32_t2 $NEW 2 -m benchmarks.generate --num-prompts 32 --hf batched --hf-batch-sizes 8 0 --repeats 3 --json $R/p32_t2.json
for a in "8 64 8" "1 64 8" "8 32 8" "1 32 4"; do
  run attention_layout_$(echo $a | tr ' ' _) $NEW 1 $R/attention_layout.py $a
done
for m in "small 1" "tiny 1"; do  # (one token: selected_experts reads row 0 only)
  run experts_step_$(echo $m | tr ' ' _) $NEW 1 $R/experts_step.py $m
done
