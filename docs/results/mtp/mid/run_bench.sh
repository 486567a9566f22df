#!/usr/bin/env bash
# issue 36 item 4, speculative part, on the mid-size MTP model of seed 0 (run_train.sh): mtp, ngram and
# self against the plain engine at batch 1 and batch 8, on code (pystdlib, the training domain) and
# prose (TinyStories, off-domain). Reduced to 8 prompts x 32 greedy tokens (the loaded machine).
# Usage: bash run_bench.sh TRAIN_DIR OUT_DIR   (run from the repository root)
set -u
CK=${1:?train dir}/on_s0; OUT=${2:?out dir}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 MOE_LAB_DATA=${MOE_LAB_DATA:-/work/shared/data}
PROSE=${MOE_LAB_DATA}/corpus/tinystories_valid_head.txt
bench() {  # batch corpus name
  { date -u; cat /proc/loadavg; } > "$OUT/$3.load"
  /usr/bin/time -o "$OUT/$3.time" -f "%e wall %U user %S sys" python -m benchmarks.generate --checkpoint "$CK" \
    --hf none --repeats 3 --num-prompts 4 --max-out 32 --threads 1 --speculative mtp,ngram,self --spec-tokens 4 \
    --spec-prompts 8 --spec-max-tokens 32 --spec-batch "$1" --corpus "$2" --json "$OUT/$3.json" > "$OUT/$3.txt" 2>&1
  echo "exit $?" >> "$OUT/$3.txt"; { date -u; cat /proc/loadavg; } >> "$OUT/$3.load"
}
(bench 1 pystdlib b1_code; bench 8 pystdlib b8_code) &
(bench 1 "$PROSE" b1_prose; bench 8 "$PROSE" b8_prose) &
wait
