#!/bin/bash
# After perf_1204c/run.sh (the tiny model's runs, into this folder): the `small` model (configs/model/small.yaml's
# shape) in issue 32's two end-to-end commands (batch 1 three invocations, 32 prompts one), the compiled engine
# against the eager one at batch 1 and <= 8, the decode profile of `small` at batch 1, and the MLA decode
# record's command (docs/results/mla_decode). Run from the repository root:
#   OMP_NUM_THREADS=1 PYTHONPATH=$PWD bash docs/results/generate/quiet_1205b/run_more.sh [<record folder>]
R=$(cd "${1:-$(dirname "$0")}" && pwd)
export WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data
SMALL="--d-model 512 --n-layers 8 --n-heads 8 --n-kv-heads 4 --n-experts 8 --expert-hidden 768"
run() { # name cmd...
  name=$1; shift
  echo "$(date -u +%T) start $name load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
  /usr/bin/time -f "%e s wall %U user %S sys" nice -n 5 python -m "$@" > $R/$name.txt 2>&1
  echo "$(date -u +%T) end $name rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
}
for i in 1 2 3; do
  run small_b1_$i benchmarks.generate $SMALL --num-prompts 6 --max-num-seqs 1 --hf sequential --threads 1 --repeats 3 --json $R/small_b1_$i.json
done
run small_p32 benchmarks.generate $SMALL --num-prompts 32 --hf batched --hf-batch-sizes 8 0 --threads 1 --repeats 3 --json $R/small_p32.json
run dp_small benchmarks.decode_profile --model small --batches 1 8 --steps 16 --threads 1 --json $R/dp_small.json
run compiled_b1 benchmarks.generate --compile --hf none --max-num-seqs 1 --num-prompts 8 --repeats 3 --threads 1 --json $R/compiled_b1.json
run compiled_b8 benchmarks.generate --compile --hf none --max-num-seqs 8 --num-prompts 16 --repeats 3 --threads 1 --json $R/compiled_b8.json
