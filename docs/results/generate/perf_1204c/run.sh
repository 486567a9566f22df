#!/bin/bash
# The three commands of issue 32's brief, three invocations each, interleaved, at the commit written to
# commit.txt. Run from the repository root; the outputs go to the folder given (default: this one):
#   OMP_NUM_THREADS=1 PYTHONPATH=$PWD bash docs/results/generate/perf_1204c/run.sh [<record folder>]
R=$(cd "${1:-$(dirname "$0")}" && pwd)  # the record's folder
export WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1 MOE_LAB_DATA=/work/shared/data
git rev-parse --short HEAD > $R/commit.txt
run() { # name cmd...
  name=$1; shift
  echo "$(date -u +%T) start $name load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
  /usr/bin/time -f "%e s wall %U user %S sys" nice -n 5 python -m "$@" > $R/$name.txt 2>&1
  echo "$(date -u +%T) end $name rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/runs.log
}
for i in 1 2 3; do
  run b1_$i benchmarks.generate --num-prompts 6 --max-num-seqs 1 --hf sequential --threads 1 --repeats 3 --json $R/b1_$i.json
  run p32_$i benchmarks.generate --num-prompts 32 --hf batched --hf-batch-sizes 8 0 --threads 1 --repeats 3 --json $R/p32_$i.json
  run dp_$i benchmarks.decode_profile --batches 1 8 64 --steps 16 --json $R/dp_$i.json
done
