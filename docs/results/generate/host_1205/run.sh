#!/bin/bash
# The decode step's host work (559223c) against the tree before it (39e3c65), each arm run from its own checkout
# (`git worktree add <OLD> 39e3c65`), interleaved, three invocations each: the step probe (host time a step),
# issue 32's `small` batch-1 command with the compiled engine, and the tiny model's compiled-vs-eager commands at
# batch 1 and at most 8. Run from the repository root on a quiet machine:
#   OMP_NUM_THREADS=1 bash docs/results/generate/host_1205/run.sh <OLD checkout>
R=$(cd "$(dirname "$0")" && pwd); NEW=$PWD; OLD=$(cd "$1" && pwd)
export WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
SMALL="--d-model 512 --n-layers 8 --n-heads 8 --n-kv-heads 4 --n-experts 8 --expert-hidden 768"
echo "new $(git -C $NEW rev-parse --short HEAD) old $(git -C $OLD rev-parse --short HEAD)" > $R/commit.txt
run() { # name tree cmd...
  name=$1; tree=$2; shift 2
  [ -e $R/$name.txt ] && { echo "error: $R/$name.txt exists" >&2; exit 2; }
  echo "$(date -u +%T) start $name load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
  (cd $tree && PYTHONPATH=$tree /usr/bin/time -f "%e s wall %U user %S sys" python "$@" > $R/$name.txt 2>&1)
  echo "$(date -u +%T) end $name rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
}
for i in 1 2 3; do
  for arm in new old; do
    tree=$NEW; [ $arm = old ] && tree=$OLD
    run probe_${arm}_$i $tree $R/step_probe.py
    run small_b1_${arm}_$i $tree -m benchmarks.generate $SMALL --compile --num-prompts 6 --max-num-seqs 1 --hf sequential --threads 1 --repeats 3 --json $R/small_b1_${arm}_$i.json
    run b8_${arm}_$i $tree -m benchmarks.generate --compile --hf none --max-num-seqs 8 --num-prompts 16 --repeats 3 --threads 1 --json $R/b8_${arm}_$i.json
    run b1_${arm}_$i $tree -m benchmarks.generate --compile --hf none --max-num-seqs 1 --num-prompts 8 --repeats 3 --threads 1 --json $R/b1_${arm}_$i.json
  done
done
