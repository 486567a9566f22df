#!/usr/bin/env bash
# Every GPU check in one prepared run, for a session that is lent a GPU (the device tool):
#
#   bash benchmarks/gpu_wheels.sh          # here, once: packages the GPU image lacks -> .whl/
#   run(command="bash benchmarks/gpu_session.sh", carry=[".whl"], timeout_s=540)
#
# Budget (at most 8 min of steps, each under its own timeout so one hang cannot eat the rest; the
# machine's start comes on top, out of the session's 15 device minutes):
#   1. the kernel, dispatch, engine and flash tests with the Triton kernels compiled for the device
#      (TRITON_INTERPRET unset; the MoE kernels autotune, as in training), <= 200 s
#   2. benchmarks/moe_layer.py --device cuda: every dispatch vs HF at 16k tokens / 64 experts /
#      top-8, TFLOP/s against the bf16 peak, <= 150 s
#   3. benchmarks/paged_attention.py: decode bandwidth vs peak, device copy and the SDPA / flash-attn
#      peers, <= 60 s
#   4. benchmarks/generate.py --device cuda: the engine vs HF generate(), <= 60 s
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

{ nvidia-smi; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
  torch.cuda.get_device_name(), 'cc', torch.cuda.get_device_capability())"; } > "$OUT/env.txt" 2>&1

step "1. CUDA tests (compiled Triton kernels vs their references)"
timeout 200 python3 -m pytest -q -p no:cacheprovider --maxfail=10 -rf --timeout 120 --durations=15 tests/kernels/test_moe_gemm.py \
  tests/kernels/test_paged_attention.py tests/experts tests/engine tests/test_attention_flash.py \
  > "$OUT/pytest_cuda.txt" 2>&1
echo "pytest exit $?" | tee -a "$LOG"; tail -n 3 "$OUT/pytest_cuda.txt" >> "$LOG"

step "2. MoE layer: dispatch variants vs HF at GPU shapes"
timeout 150 python3 -m benchmarks.moe_layer --device cuda --out "$OUT/moe_layer.json" >> "$LOG" 2>&1
echo "moe_layer exit $?" | tee -a "$LOG"

step "3. paged-attention decode bandwidth"
timeout 60 python3 -m benchmarks.paged_attention --json "$OUT/paged_attention.json" >> "$LOG" 2>&1
echo "paged_attention exit $?" | tee -a "$LOG"

step "4. engine vs HF generate() on the GPU"
timeout 60 python3 -m benchmarks.generate --device cuda --dtype bf16 --hf batched --repeats 2 \
  --json "$OUT/generate.json" >> "$LOG" 2>&1
echo "generate exit $?" | tee -a "$LOG"
step "done"
