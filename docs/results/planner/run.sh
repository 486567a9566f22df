#!/usr/bin/env bash
# The planner figures of docs/results/planner/README.md (MLA and GPT-OSS): run from the repository root.
# Planner outputs are computed (meta-device weights and activations, no timing): one run each is the record.
set -u
out=docs/results/planner
{ date -u; git rev-parse HEAD; uname -a; uptime; } > $out/machine.txt
for spec in "deepseek-v2-lite 141GB" "deepseek-v3 141GB" "gpt-oss-20b 141GB" "gpt-oss-20b 80GB" "gpt-oss-20b 16GB" \
            "gpt-oss-120b 141GB" "gpt-oss-120b 80GB" "gpt-oss-120b 16GB"; do
  set -- $spec
  cmd="python -m moe.engine.memory.plan benchmarks/model_configs/$1 --device-memory $2 --dtype bf16"
  { echo "\$ $cmd"; $cmd; echo "exit code $?"; echo; } >> $out/plans.txt 2>&1
  $cmd --json >> $out/plans.jsonl 2>&1
done
python -m benchmarks.kv_bytes benchmarks/model_configs/{deepseek-v2-lite,deepseek-v3,gpt-oss-20b,gpt-oss-120b} \
  --dtype bf16 --context 32768 > $out/kv_bytes.jsonl
