"""Sizes of real MoE models, from their published config.json fields: parameters (total and
active per token), weight bytes by dtype, KV-cache bytes per token, and what that leaves on one
H200 (141 GB) and on a node of 8. The arithmetic behind docs/design/scale.md.

    python -m benchmarks.scale_sizes
    python -m benchmarks.scale_sizes --device-gb 80          # an H100 / A100 80 GB

The counts are a plain formula over the HF fields (no model is built);
tests/benchmarks/test_scale_sizes.py checks that they equal, exactly, the parameter counts of our
`Transformer` built on the meta device from the same configs (`moe.hf.convert.model_config_from_hf`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from moe.report import markdown_table  # noqa: E402

# The published config.json fields that decide the sizes (huggingface.co/<name>/blob/main/config.json).
MODELS: dict[str, dict] = {
    "Mixtral-8x7B-v0.1": {
        "model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
        "num_experts_per_tok": 2, "max_position_embeddings": 32768, "rope_theta": 1e6, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "sliding_window": None},
    "Qwen3-30B-A3B": {
        "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
        "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "norm_topk_prob": True, "attention_bias": False, "max_position_embeddings": 40960,
        "rope_theta": 1e6, "rms_norm_eps": 1e-6, "tie_word_embeddings": False},
    "OLMoE-1B-7B-0924": {
        "model_type": "olmoe", "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 1024,
        "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 64,
        "num_experts_per_tok": 8, "norm_topk_prob": False, "attention_bias": False, "clip_qkv": None,
        "max_position_embeddings": 4096, "rope_theta": 1e4, "rms_norm_eps": 1e-5, "tie_word_embeddings": False},
}
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp8": 1, "int4": 0.5}
TRAIN_BYTES_PER_PARAM = 16  # our trainer: fp32 weights + fp32 grads + AdamW exp_avg + exp_avg_sq (bf16 is autocast)
USABLE = 0.90  # of a GPU's memory: the CUDA context, allocator fragmentation and a reserve take the rest


def sizes(c: dict) -> dict:
    """Parameter counts and per-token KV bytes of an HF config of the four families (plain arithmetic)."""
    D, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    H, G = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or D // H
    E, k = c.get("num_local_experts") or c["num_experts"], c["num_experts_per_tok"]
    I_moe = c.get("moe_intermediate_size") or c["intermediate_size"]
    bias = c.get("attention_bias", False)
    attn = D * H * hd + 2 * D * G * hd + H * hd * D + (bias * ((H + 2 * G) * hd + D))
    qk_norm = {"olmoe": (H + G) * hd, "qwen3_moe": 2 * hd}.get(c["model_type"], 0)
    expert = 3 * D * I_moe
    step, dense_ids = c.get("decoder_sparse_step", 1), set(c.get("mlp_only_layers", []))
    moe_layers = sum(1 for i in range(L) if (i + 1) % step == 0 and i not in dense_ids)
    dense_ffn = 3 * D * c["intermediate_size"]
    total = (V * D * (1 if c["tie_word_embeddings"] else 2) + D  # embeddings, LM head, final norm
             + L * (2 * D + attn + qk_norm) + moe_layers * (E * D + E * expert) + (L - moe_layers) * dense_ffn)
    active = total - moe_layers * (E - k) * expert
    return {"params": total, "active": active, "kv_elems_per_token": 2 * L * G * hd}


def rows(device_gb: float) -> tuple[list, list]:
    size_rows, fit_rows = [], []
    budget1 = USABLE * device_gb * 1e9
    for name, c in MODELS.items():
        s = sizes(c)
        kv = s["kv_elems_per_token"] * 2  # bf16 cache
        size_rows.append([name, f"{s['params'] / 1e9:.2f}B", f"{s['active'] / 1e9:.2f}B",
                          *(f"{s['params'] * b / 1e9:.1f}" for b in DTYPE_BYTES.values()), f"{kv / 1024:.0f} KiB"])
        for dtype in ("bf16", "fp8"):
            w = s["params"] * DTYPE_BYTES[dtype]
            left = budget1 - w
            fit_rows.append([name, dtype, f"{w / 1e9:.1f}", f"{left / 1e9:.1f}" if left > 0 else "does not fit",
                             f"{left / kv / 1e3:.0f}k" if left > 0 else "-"])
    return size_rows, fit_rows


def train_rows(device_gb: float, gpus: int) -> list:
    out = []
    for name, c in MODELS.items():
        s = sizes(c)
        state = s["params"] * TRAIN_BYTES_PER_PARAM
        per_rank = state / gpus
        left = USABLE * device_gb * 1e9 - per_rank
        out.append([name, f"{state / 1e9:.0f}", f"{per_rank / 1e9:.1f}",
                     f"{left / 1e9:.1f}" if left > 0 else f"short by {-left / 1e9:.0f}"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device-gb", type=float, default=141.0, help="GPU memory in GB (H200: 141)")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs of a node, for the training table")
    args = ap.parse_args(argv)
    size_rows, fit_rows = rows(args.device_gb)
    print(markdown_table(["model", "params", "active / token", *(f"{d} GB" for d in DTYPE_BYTES), "KV / token (bf16)"],
                         size_rows))
    print(f"\nServing on one {args.device_gb:.0f} GB GPU ({USABLE:.0%} usable), before activations:\n")
    print(markdown_table(["model", "weights", "weights (GB)", "left for KV + activations (GB)",
                          "bf16 KV tokens in that"], fit_rows))
    for gpus in (1, args.gpus):
        print(f"\nFull training state ({TRAIN_BYTES_PER_PARAM} B/param) sharded over {gpus} x {args.device_gb:.0f} GB "
              "(FSDP), before activations:\n")
        print(markdown_table(["model", "state (GB)", "per GPU (GB)", "left per GPU (GB)"],
                             train_rows(args.device_gb, gpus)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
