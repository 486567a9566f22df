#!/bin/bash
# The frontier record's three sweeps again (the command of ../README.md, out-dir here), each with its command,
# console, load average at start and end and /usr/bin/time -v output, as the first runs kept them. From the
# repository root:  bash docs/results/serving_frontier/rerun_1205/run.sh
R=$(cd "$(dirname "$0")" && pwd)
export WANDB_MODE=offline WANDB_SILENT=true OMP_NUM_THREADS=1
git rev-parse --short HEAD > $R/commit.txt
for N in 1 2 3; do
  D=$R/run$N
  [ -e $D ] && { echo "error: $D exists" >&2; exit 2; }
  mkdir -p $D
  CMD=(nice -n 5 python -m benchmarks.serving --launch /work/ckpt/default --server-args "--threads 1"
       --sweep 'max_num_seqs=32,64,128,256' --sweep 'max_num_batched_tokens=512,2048'
       --concurrency 16,64 --num-prompts 64 --max-tokens 32 --ignore-eos --out-dir $D --tag tiny-cpu)
  echo "OMP_NUM_THREADS=1 ${CMD[*]}" > $D/command.txt
  cat /proc/loadavg > $D/loadavg_start.txt
  /usr/bin/time -v -o $D/time.txt "${CMD[@]}" > $D/console.txt 2>&1
  cat /proc/loadavg > $D/loadavg_end.txt
done
