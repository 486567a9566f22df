#!/usr/bin/env bash
# Quiet-machine re-run of issue 32's headline comparisons (2026-12-04), three invocations of each.
set -euo pipefail
D=docs/results/generate/quiet_1204
for i in 1 2 3; do
  uptime >> $D/runs.log
  python -m benchmarks.generate --num-prompts 6 --max-num-seqs 1 --hf sequential --threads 1 --repeats 3 \
    --json $D/b1_$i.json > $D/b1_$i.txt 2>&1
  python -m benchmarks.generate --num-prompts 32 --hf batched --hf-batch-sizes 8 0 --threads 1 --repeats 3 \
    --json $D/p32_$i.json > $D/p32_$i.txt 2>&1
done
uptime >> $D/runs.log
