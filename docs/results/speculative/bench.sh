#!/usr/bin/env bash
# bench.sh code|prose [tag]: the speculative comparison of docs/design/speculative.md, 3 timed runs a
# side. `--hf sequential` (not the doc's old `--hf none`, which now leaves out the HF peers of the
# speculative part too) with a 4-prompt main workload, which this record does not use.
source "$(dirname "$0")/common.sh"
corpus=$1; tag=${2:-}
case $corpus in
    code) args=(--checkpoint $TARGET_CODE --draft-checkpoint $CK/spec_code_draft) ;;
    prose) args=(--checkpoint $CK/spec_prose --draft-checkpoint $CK/spec_prose_draft
                 --corpus $MOE_LAB_DATA/corpus/tinystories_valid_head.txt) ;;
    *) echo "error: corpus must be code or prose, not '$corpus'" >&2; exit 2 ;;
esac
out=$REC/$corpus$tag.json
[ -e "$out" ] && { echo "error: $out exists" >&2; exit 2; }
timed bench_$corpus$tag python -m benchmarks.generate "${args[@]}" --hf sequential --num-prompts 4 --max-out 16 \
    --repeats 3 --threads 1 --speculative ngram,draft,self --json $out
