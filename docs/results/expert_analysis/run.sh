#!/usr/bin/env bash
# The commands of docs/guides/expert_analysis.md ("A CPU run"), as run for this record.
# Usage: run.sh corpus|train SEED|analysis SEED [REPEAT]   (OUT defaults to /work/ea)
# Run from the repository root with PYTHONPATH=., MOE_LAB_DATA=../shared/data.
set -euo pipefail
OUT=${OUT:-/work/ea}
export OMP_NUM_THREADS=1 WANDB_MODE=offline HF_HUB_OFFLINE=1
step=$1
case "$step" in
corpus)
  OUT="$OUT" python - <<'PY'   # writes $OUT/corpus/{mix.jsonl,code_heldout.txt,plays_heldout.txt}
import json, os
from pathlib import Path
from moe.data.sources import iter_stdlib_documents
out, corpus = Path(os.environ["OUT"]) / "corpus", Path("../shared/data/corpus")
out.mkdir(parents=True, exist_ok=True)
def chunks(text, size=2000):
    piece, n = [], 0
    for line in text.splitlines(keepends=True):
        piece.append(line); n += len(line)
        if n >= size:
            yield "".join(piece); piece, n = [], 0
    if piece:
        yield "".join(piece)
code_train, code_held, total = [], [], 0
for i, doc in enumerate(iter_stdlib_documents()):
    if total < 500_000:
        code_train.append(doc); total += len(doc)
    elif len("".join(code_held)) >= 100_000:
        break
    elif i % 2:
        code_held.append(doc)
plays = (corpus / "tinyshakespeare.txt").read_text()
docs = ([c for d in code_train for c in chunks(d)] + list(chunks((corpus / "tinystories_train_head.txt").read_text()))
        + list(chunks(plays[:500_000])))
(out / "mix.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
(out / "code_heldout.txt").write_text("".join(code_held))
(out / "plays_heldout.txt").write_text(plays[-100_000:])
print(len(docs), "documents;", sum(map(len, docs)), "chars;", sum(map(len, code_held)), "chars of held-out code")
PY
  ;;
train)
  seed=$2
  nice -n 5 python train.py data=text data.path="$OUT/corpus/mix.jsonl" train.max_steps=1000 \
    train.ckpt_interval=100 train.keep_last=20 train.eval_interval=100 logger=none seed="$seed" \
    hydra.run.dir="$OUT/run_seed$seed"
  ;;
analysis)
  seed=$2; rep=${3:-1}
  nice -n 5 python -m eval task=expert_analysis ckpt="$OUT/run_seed$seed" logger=none eval.compare_top_k=1 \
    "eval.domains={code:$OUT/corpus/code_heldout.txt,stories:../shared/data/corpus/tinystories_valid_head.txt,plays:$OUT/corpus/plays_heldout.txt}" \
    hydra.run.dir="$OUT/analysis_seed${seed}_rep$rep"
  ;;
esac
