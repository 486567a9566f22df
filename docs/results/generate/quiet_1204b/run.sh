#!/usr/bin/env bash
# Quiet-machine re-run of issue 32's comparisons at the end of the 4 Dec session (after the gathered
# decode of docs/results/generate/dec_1204/): three invocations of each, interleaved, plus decode_profile.
set -euo pipefail
D=docs/results/generate/quiet_1204b
git rev-parse HEAD > $D/commit.txt
for i in 1 2 3; do
  uptime >> $D/runs.log
  python -m benchmarks.generate --num-prompts 6 --max-num-seqs 1 --hf sequential --threads 1 --repeats 3 \
    --json $D/b1_$i.json > $D/b1_$i.txt 2>&1
  python -m benchmarks.generate --num-prompts 32 --hf batched --hf-batch-sizes 8 0 --threads 1 --repeats 3 \
    --json $D/p32_$i.json > $D/p32_$i.txt 2>&1
  python -m benchmarks.decode_profile --batches 1 8 64 --steps 16 --json $D/dp_$i.json > $D/dp_$i.txt 2>&1
done
uptime >> $D/runs.log
