#!/usr/bin/env bash
# Every GPU check in one prepared run, for a session that is lent a GPU (the device tool):
#
#   bash benchmarks/gpu_wheels.sh          # here, once: packages the GPU image lacks -> .whl/
#   run(command="STEPS='1 2 3 4' bash benchmarks/gpu_session.sh", carry=[".whl"], timeout_s=540)
#
# Budget: the steps' timeouts add up to ~19 min, more than one session's 15 device minutes (the
# machine's start comes out of them too) and more than one command's 10. Run them in groups, one
# group per call: STEPS='1 2 3 4' (<= 470 s), STEPS=5 (<= 330 s), STEPS=6 (<= 360 s), STEPS=7 (<= 150 s); a session
# that is lent a GPU does the first group, the next session the others. Each step has its own
# timeout so one hang cannot eat the rest:
#   1. the kernel, dispatch, engine and flash tests with the Triton kernels compiled for the device
#      (TRITON_INTERPRET unset; the MoE kernels autotune, as in training), <= 200 s
#   2. benchmarks/moe_layer.py --device cuda: every dispatch vs HF at 16k tokens / 64 experts /
#      top-8, TFLOP/s against the bf16 peak, <= 150 s
#   3. benchmarks/paged_attention.py: decode bandwidth vs peak, device copy and the SDPA / flash-attn
#      peers, <= 60 s
#   4. benchmarks/generate.py --device cuda: the engine vs HF generate(), <= 60 s
#   5. (issue 17) benchmarks/generate.py --compile: CUDA-graph decode vs eager and HF, the compiled-decode
#      and speculative-decoding engine tests on the GPU, and (with SPEC_CHECKPOINT=..., optional
#      SPEC_DRAFT=...) --speculative at batch 1, <= 330 s
#   7. (issue 32) batch-1 decode: the engine vs HF generate() one prompt at a time on the `small`
#      random model, and both against the bandwidth bound of its active weights, <= 150 s
#   6. quantization (issue 16): its tests on CUDA, the Triton quantized GEMMs against dequantise+matmul
#      and bf16 (benchmarks/quant_gemm.py, table in log.txt), engine tokens/s per scheme and KV dtype, <= 360 s
# Results land in $OUT (what the device tool brings back; at most 8 files): env.txt, log.txt,
# pytest_cuda.txt, moe_layer.json, paged_attention.json, generate.json. Record them in docs/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled HF_HUB_OFFLINE=1
unset TRITON_INTERPRET
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LOG="$OUT/log.txt"
step() { echo "=== $(date -u +%T) $*" | tee -a "$LOG"; }
# STEPS="1 2 3 4" runs those steps only (default: all). Every step keeps its own timeout.
want() { [ -z "${STEPS:-}" ] || [[ " $STEPS " == *" $1 "* ]]; }

{ nvidia-smi; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
  torch.cuda.get_device_name(), 'cc', torch.cuda.get_device_capability())"; } > "$OUT/env.txt" 2>&1

if want 1; then
step "1. CUDA tests (compiled Triton kernels vs their references)"
timeout 200 python3 -m pytest -q -p no:cacheprovider --maxfail=10 -rf --timeout 120 --durations=15 tests/kernels \
  --ignore=tests/kernels/test_compile_check.py tests/experts tests/attention tests/engine \
  > "$OUT/pytest_cuda.txt" 2>&1
echo "pytest exit $?" | tee -a "$LOG"; tail -n 3 "$OUT/pytest_cuda.txt" >> "$LOG"
fi

if want 2; then
step "2. MoE layer: dispatch variants vs HF at GPU shapes"
timeout 150 python3 -m benchmarks.moe_layer --device cuda --out "$OUT/moe_layer.json" >> "$LOG" 2>&1
echo "moe_layer exit $?" | tee -a "$LOG"
fi

if want 3; then
step "3. paged-attention decode bandwidth"
timeout 60 python3 -m benchmarks.paged_attention --json "$OUT/paged_attention.json" >> "$LOG" 2>&1
echo "paged_attention exit $?" | tee -a "$LOG"
fi

if want 4; then
step "4. engine vs HF generate() on the GPU"
timeout 60 python3 -m benchmarks.generate --device cuda --dtype bf16 --hf batched --repeats 2 \
  --json "$OUT/generate.json" >> "$LOG" 2>&1
echo "generate exit $?" | tee -a "$LOG"
fi
# ---- issue 17 (decode speed): compiled decode with CUDA graphs, speculative decoding ---------------
# The compiled engine (torch.compile mode "reduce-overhead" = CUDA graphs per batch bucket) must be
# token-identical to the eager one (the benchmark exits 1 otherwise), and its tok/s against HF's padded
# batch is the issue's compiled-decode figure on the GPU. Speculation at batch 1 needs a trained
# checkpoint: train one first when the session has one (see docs/design/speculative.md); without, skipped.
if want 5; then
step "5. issue 17: compiled decode (CUDA graphs) vs eager engine and HF generate()"
timeout 150 python3 -m benchmarks.generate --device cuda --dtype bf16 --hf batched --repeats 2 --compile \
  --json "$OUT/generate_compiled.json" >> "$LOG" 2>&1
echo "generate --compile exit $?" | tee -a "$LOG"
timeout 60 env TRITON_INTERPRET= python3 -m pytest -q -x tests/engine/runner/test_compiled.py tests/engine/speculative/test_decoder.py \
  >> "$LOG" 2>&1
echo "compiled/spec tests exit $?" | tee -a "$LOG"
if [ -n "${SPEC_CHECKPOINT:-}" ]; then
  timeout 120 python3 -m benchmarks.generate --device cuda --dtype bf16 --checkpoint "$SPEC_CHECKPOINT" --hf none \
    --speculative ngram,self${SPEC_DRAFT:+,draft} ${SPEC_DRAFT:+--draft-checkpoint "$SPEC_DRAFT"} --repeats 2 \
    --json "$OUT/generate_spec.json" >> "$LOG" 2>&1
  echo "generate --speculative exit $?" | tee -a "$LOG"
fi
fi
# ---- end issue 17 ----------------------------------------------------------------------------------

# ==== issue 16 (quantization): GPU steps not yet run; <= 360 s ====================================
# What CPU runs cannot show: the quantized paths and the FP8 KV cache on CUDA in bf16 (the tests
# pass on CPU in fp32), the Triton weight-only GEMMs (kernels/quant_gemm) compiled and timed, and the
# engine's tokens/s per scheme on a GPU (the quantized modules use those GEMMs on CUDA). Step 1 has
# already run tests/kernels/quant_gemm compiled; tests/quant/test_dispatch.py runs here. The benchmark
# prints its table to log.txt (no JSON: $OUT's 8 files are spoken for) and exits 1 on a wrong output.
# The engine loop below now runs the quantized GEMMs too, autotuning each new shape on first use
# (hence 120 s, up from 30).
if want 6; then
step "6. quantization: tests on CUDA, then the sweep's engine numbers"
timeout 90 python3 -m pytest -q -x tests/quant tests/engine/runner/test_kv_fp8.py tests/test_quantize.py \
  >> "$LOG" 2>&1
echo "quant tests exit $?" | tee -a "$LOG"
timeout 150 python3 -m benchmarks.quant_gemm --device cuda --dtype bf16 >> "$LOG" 2>&1
echo "quant_gemm exit $?" | tee -a "$LOG"
timeout 120 python3 - >> "$LOG" 2>&1 <<'PY'
import time, torch
from moe.engine import LLM, SamplingParams
from tests.engine.conftest import build_model
for q in ("none", "int8", "int4", "fp8"):
    for kv in ("auto", "fp8_e4m3"):
        m = build_model(260, d_model=512, n_heads=8, n_kv_heads=8, n_layers=4, expert_hidden=512).cuda().bfloat16()
        llm = LLM.from_model(m, None, quantization=q, kv_cache_dtype=kv, collect_routing_stats=False)
        p = [[5 + i] * 64 for i in range(32)]
        sp = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
        llm.generate(p[:1], sp); torch.cuda.synchronize(); t = time.perf_counter()
        n = sum(len(o.token_ids) for o in llm.generate(p, sp)); torch.cuda.synchronize()
        print(f"quant={q} kv={kv}: {n / (time.perf_counter() - t):.0f} tok/s, "
              f"{llm.stats()['kv_bytes_per_token']} KV bytes/token, {llm.num_blocks} blocks")
PY
echo "quant engine exit $?" | tee -a "$LOG"
fi
# ==== end issue 16 ================================================================================
# ---- issue 32 (decode speed at batch 1): not yet run; <= 150 s --------------------------------------
# Batch 1 is where an engine's per-step overhead shows: the engine decoding one request at a time
# (--max-num-seqs 1) against HF generate() one prompt at a time, same `small` random model (86M params,
# 29M active), bf16, median of 3; exits 1 on any differing token. Then both against the decode bound
# of the weights a token reads: active params x 2 bytes / the H200's 4.8 TB/s HBM bandwidth (the KV
# cache of a 6-72 token context is negligible beside them). On CPU (docs/results/generate/) the
# engine's batch-1 ratio to HF is the issue's headline; on the GPU both are expected launch-bound
# (tiny GEMMs), so the bound is far off: the figure says how far.
if want 7; then
step "7. issue 32: batch-1 decode, engine vs HF generate(), vs the active-weight bandwidth bound"
timeout 120 python3 -m benchmarks.generate --device cuda --dtype bf16 --d-model 512 --n-layers 8 \
  --expert-hidden 768 --num-prompts 6 --max-num-seqs 1 --hf sequential --repeats 3 \
  --json "$OUT/generate_b1.json" >> "$LOG" 2>&1
echo "generate batch 1 exit $?" | tee -a "$LOG"
timeout 20 python3 - "$OUT/generate_b1.json" >> "$LOG" 2>&1 <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
bound = 4.8e12 / (r["active_params"] * 2)  # tokens/s if each token only streamed its active bf16 weights once
for side in ("engine", "hf_sequential"):
    tps = r[f"{side}_tok_s"]
    print(f"batch 1 {side}: {tps:.0f} tok/s = {tps / bound:.3%} of the {bound:,.0f} tok/s active-weight bound")
print(f"engine / HF sequential (wall): {r['engine_vs_hf_sequential_wall']:.2f}x")
PY
fi
# ---- end issue 32 -----------------------------------------------------------------------------------
step "done"
