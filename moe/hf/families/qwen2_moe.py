"""Qwen2-MoE (`Qwen2MoeForCausalLM`, Qwen1.5-MoE-A2.7B / Qwen2-57B-A14B): softmax top-k
(renormalised when `norm_topk_prob`), biases on q/k/v (`qkv_bias`; none on the output
projection), a shared expert of width `shared_expert_intermediate_size` scaled per token by a
sigmoid gate (`shared_expert_gate`), a separate `head_dim` when set, and dense layers where
`decoder_sparse_step` / `mlp_only_layers` say so (width `intermediate_size`); sliding-window
layers where `layer_types` says so (HF derives them from `use_sliding_window` / `max_window_layers`)."""

from __future__ import annotations

from typing import Any

from transformers import Qwen2MoeConfig

from moe.config import ModelConfig
from moe.hf.families.base import FAMILIES, Family, dense_ids_of, dense_layout, hf_layer_fields, layer_fields


@FAMILIES.register("qwen2_moe")
class Qwen2Moe(Family):
    model_type = "qwen2_moe"
    display_name = "Qwen2-MoE"
    architecture = "Qwen2MoeForCausalLM"
    config_class = Qwen2MoeConfig
    mapped = frozenset({"intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                        "num_experts", "norm_topk_prob", "qkv_bias", "decoder_sparse_step", "mlp_only_layers",
                        "use_sliding_window", "layer_types", "sliding_window"})
    ignored = {"max_window_layers": "only read to derive layer_types when none are given; layer_types is read"}
    window_support = "per_layer"

    def input_refusals(self, c) -> list:
        kinds = sorted(set(c.layer_types or []) - {"full_attention", "sliding_attention"})
        return [
            (bool(kinds), "layer_types", c.layer_types, f"layer kinds {kinds} are not full or sliding attention"),
            (c.num_experts <= 0, "num_experts", c.num_experts, "a model without experts is not an MoE"),
            (c.shared_expert_intermediate_size <= 0, "shared_expert_intermediate_size",
             c.shared_expert_intermediate_size, "Qwen2-MoE layers always have a shared expert"),
        ]

    def model_fields(self, c) -> dict[str, Any]:
        return dict(n_experts=c.num_experts, expert_hidden=c.moe_intermediate_size, dense_hidden=c.intermediate_size,
                    dense_layers=dense_ids_of(c.decoder_sparse_step, c.mlp_only_layers, c.num_hidden_layers),
                    n_shared_experts=1, shared_expert_hidden=c.shared_expert_intermediate_size,
                    shared_expert_gate=True, qkv_bias=bool(c.qkv_bias), renormalize=bool(c.norm_topk_prob),
                    **layer_fields(c))

    def refusals(self, m: ModelConfig) -> list:
        return [
            (m.n_shared_experts == 0, "model.n_shared_experts", m.n_shared_experts,
             "every Qwen2-MoE layer has a (gated) shared expert"),
            (m.n_shared_experts > 0 and not m.shared_expert_gate, "model.shared_expert_gate", m.shared_expert_gate,
             "Qwen2-MoE always scales its shared expert by a sigmoid gate"),
            (m.qk_norm != "none", "model.qk_norm", m.qk_norm, "Qwen2-MoE has no qk-norm"),
            (m.attn_out_bias, "model.attn_out_bias", m.attn_out_bias, "Qwen2-MoE's output projection has no bias"),
            (m.clip_qkv is not None, "model.clip_qkv", m.clip_qkv, "Qwen2-MoE does not clip q/k/v"),
        ]

    def hf_fields(self, m: ModelConfig) -> dict[str, Any]:
        step, mlp_only = dense_layout(m.dense_layer_ids, m.n_layers)
        return dict(intermediate_size=m.dense_hidden or m.expert_hidden * m.router.top_k,
                    moe_intermediate_size=m.expert_hidden, shared_expert_intermediate_size=m.resolved_shared_hidden,
                    num_experts=m.n_experts, norm_topk_prob=bool(m.router.renormalize), qkv_bias=bool(m.qkv_bias),
                    decoder_sparse_step=step, mlp_only_layers=mlp_only, **hf_layer_fields(m))
