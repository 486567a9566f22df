#!/bin/bash
# The torch backend's prefill paths (issue 32): the per-operation A/B at the tiny model's head dim (32) and
# `small`'s (64), then interleaved end-to-end A/Bs against the previous rule (`padded.py`), three invocations
# each: issue 32's 32-prompt command on the tiny model (HF static batches of 8 and one padded batch) and its
# `small` batch-1 command with the compiled engine. Run from the repository root on a quiet machine:
#   OMP_NUM_THREADS=1 PYTHONPATH=$PWD bash docs/results/generate/prefill_1205/run.sh
R=$(cd "$(dirname "$0")" && pwd)
export WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
SMALL="--d-model 512 --n-layers 8 --n-heads 8 --n-kv-heads 4 --n-experts 8 --expert-hidden 768"
git rev-parse --short HEAD > $R/commit.txt
run() { # name cmd...
  name=$1; shift
  [ -e $R/$name.json ] && { echo "error: $R/$name.json exists" >&2; exit 2; }
  echo "$(date -u +%T) start $name load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
  /usr/bin/time -f "%e s wall %U user %S sys" python "$@" --json $R/$name.json > $R/$name.txt 2>&1
  echo "$(date -u +%T) end $name rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
}
run ab_d32 -m benchmarks.prefill_attention_ab --head-dim 32
run ab_d64 -m benchmarks.prefill_attention_ab --head-dim 64
for i in 1 2 3; do
  run p32_new_$i -m benchmarks.generate --num-prompts 32 --hf batched --hf-batch-sizes 8 0 --threads 1 --repeats 3
  run p32_old_$i $R/padded.py --num-prompts 32 --hf batched --hf-batch-sizes 8 0 --threads 1 --repeats 3
  run small_b1_new_$i -m benchmarks.generate $SMALL --compile --num-prompts 6 --max-num-seqs 1 --hf sequential --threads 1 --repeats 3
  run small_b1_old_$i $R/padded.py $SMALL --compile --num-prompts 6 --max-num-seqs 1 --hf sequential --threads 1 --repeats 3
done
