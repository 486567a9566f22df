"""Qwen3-MoE (`Qwen3MoeForCausalLM`, Qwen3-30B-A3B / 235B-A22B): softmax top-k (renormalised
when `norm_topk_prob`), per-head RMSNorm on q and k (our `qk_norm="head"`), optional biases on
all four attention projections (`attention_bias`), a separate `head_dim`, and dense layers where
`decoder_sparse_step` / `mlp_only_layers` say so (our `dense_layers`, width `intermediate_size`)."""

from __future__ import annotations

from typing import Any

from transformers import Qwen3MoeConfig

from moe.config import ModelConfig
from moe.hf.families.base import FAMILIES, Family, dense_ids_of, dense_layout


@FAMILIES.register("qwen3_moe")
class Qwen3Moe(Family):
    model_type = "qwen3_moe"
    display_name = "Qwen3-MoE"
    architecture = "Qwen3MoeForCausalLM"
    config_class = Qwen3MoeConfig
    mapped = frozenset({"intermediate_size", "moe_intermediate_size", "num_local_experts", "norm_topk_prob",
                        "attention_bias", "decoder_sparse_step", "mlp_only_layers", "use_sliding_window",
                        "sliding_window"})
    ignored = {"max_window_layers": "only read with use_sliding_window, which is refused"}

    def input_refusals(self, c) -> list:
        return [
            (bool(c.use_sliding_window), "use_sliding_window", c.use_sliding_window,
             "our attention is full causal attention"),
            (c.num_experts <= 0, "num_experts", c.num_experts, "a model without experts is not an MoE"),
        ]

    def model_fields(self, c) -> dict[str, Any]:
        return dict(n_experts=c.num_experts, expert_hidden=c.moe_intermediate_size, dense_hidden=c.intermediate_size,
                    dense_layers=dense_ids_of(c.decoder_sparse_step, c.mlp_only_layers, c.num_hidden_layers),
                    qk_norm="head", qkv_bias=bool(c.attention_bias), attn_out_bias=bool(c.attention_bias),
                    renormalize=bool(c.norm_topk_prob))

    def refusals(self, m: ModelConfig) -> list:
        return [
            (m.qk_norm != "head", "model.qk_norm", m.qk_norm, "Qwen3-MoE normalises each q and k head ('head')"),
            (m.qkv_bias != m.attn_out_bias, "model.qkv_bias", m.qkv_bias,
             "Qwen3-MoE's attention_bias puts biases on all four projections or none (model.attn_out_bias="
             f"{m.attn_out_bias})"),
            (m.clip_qkv is not None, "model.clip_qkv", m.clip_qkv, "Qwen3-MoE does not clip q/k/v"),
            (m.n_shared_experts > 0, "model.n_shared_experts", m.n_shared_experts, "Qwen3-MoE has no shared experts"),
        ]

    def hf_fields(self, m: ModelConfig) -> dict[str, Any]:
        step, mlp_only = dense_layout(m.dense_layer_ids, m.n_layers)
        return dict(intermediate_size=m.dense_hidden or m.expert_hidden * m.router.top_k,
                    moe_intermediate_size=m.expert_hidden, num_experts=m.n_experts,
                    norm_topk_prob=bool(m.router.renormalize), attention_bias=bool(m.qkv_bias),
                    decoder_sparse_step=step, mlp_only_layers=mlp_only, use_sliding_window=False, sliding_window=None)
