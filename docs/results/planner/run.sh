#!/usr/bin/env bash
# The planner figures of docs/results/planner/README.md (MLA and GPT-OSS): run from the repository root.
# Planner outputs are computed (meta-device weights and activations, no timing): one run each is the record.
set -u
out=docs/results/planner
: > $out/plans.txt; : > $out/plans.jsonl
{ date -u; git rev-parse HEAD; uname -a; uptime; } > $out/machine.txt
plan() {  # one plan, its text (with the command and exit code) and its --json form
  cmd="python -m moe.engine.memory.plan $*"
  { echo "\$ $cmd"; $cmd; echo "exit code $?"; echo; } >> $out/plans.txt 2>&1
  $cmd --json >> $out/plans.jsonl 2>&1
}
for spec in "deepseek-v2-lite 141GB" "deepseek-v3 141GB"; do
  set -- $spec
  plan benchmarks/model_configs/$1 --device-memory $2 --dtype bf16
done
# GPT-OSS: bf16 weights and the engine's counting at this commit (hybrid: nothing freed), then the weights as
# shipped (MXFP4 experts, --quant auto) with window layers at their window (--kv-groups per-group)
for m in gpt-oss-20b gpt-oss-120b; do
  for mem in 141GB 80GB 16GB; do
    plan benchmarks/model_configs/$m --device-memory $mem --dtype bf16
    plan benchmarks/model_configs/$m --device-memory $mem --dtype bf16 --quant auto --kv-groups per-group
  done
done
# 20b in 16 GB at shorter contexts (MXFP4, both countings); the 32k per-group vs all-layers KV of a sequence
for len in 32768 16384; do
  plan benchmarks/model_configs/gpt-oss-20b --device-memory 16GB --dtype bf16 --quant auto --max-model-len $len
  plan benchmarks/model_configs/gpt-oss-20b --device-memory 16GB --dtype bf16 --quant auto --max-model-len $len \
    --kv-groups per-group
done
# decode-sized steps (16 tokens): the window group holds its window and one step's tokens
plan benchmarks/model_configs/gpt-oss-20b --device-memory 16GB --dtype bf16 --quant auto --max-model-len 32768 \
  --kv-groups per-group --max-num-batched-tokens 16
python -m benchmarks.kv_bytes benchmarks/model_configs/{deepseek-v2-lite,deepseek-v3,gpt-oss-20b,gpt-oss-120b} \
  --dtype bf16 --context 32768 > $out/kv_bytes.jsonl
