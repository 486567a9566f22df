"""OLMoE (`OlmoeForCausalLM`, AllenAI's OLMoE-1B-7B): softmax top-k (renormalised when
`norm_topk_prob`), RMSNorm over the whole q and k projection outputs (our `qk_norm="full"`),
optional biases on all four attention projections (`attention_bias`) and q/k/v clamping
(`clip_qkv`); no shared experts, every layer MoE."""

from __future__ import annotations

from typing import Any

from transformers import OlmoeConfig

from moe.config import ModelConfig
from moe.hf.families.base import FAMILIES, Family, hf_head_dim


@FAMILIES.register("olmoe")
class Olmoe(Family):
    model_type = "olmoe"
    display_name = "OLMoE"
    architecture = "OlmoeForCausalLM"
    config_class = OlmoeConfig
    head_dim_field = "never"
    mapped = frozenset({"intermediate_size", "num_experts", "norm_topk_prob", "attention_bias", "clip_qkv"})

    def input_refusals(self, c) -> list:
        default = c.hidden_size // c.num_attention_heads
        return [(hf_head_dim(c) != default, "head_dim", hf_head_dim(c),
                 f"OLMoE's q_norm is hidden_size wide, so the head dim must be hidden_size / heads = {default}")]

    def model_fields(self, c) -> dict[str, Any]:
        return dict(n_experts=c.num_experts, expert_hidden=c.intermediate_size, qk_norm="full",
                    qkv_bias=bool(c.attention_bias), attn_out_bias=bool(c.attention_bias), clip_qkv=c.clip_qkv,
                    renormalize=bool(c.norm_topk_prob))

    def refusals(self, m: ModelConfig) -> list:
        return [
            (m.qk_norm != "full", "model.qk_norm", m.qk_norm, "OLMoE normalises the whole q and k outputs ('full')"),
            (m.qkv_bias != m.attn_out_bias, "model.qkv_bias", m.qkv_bias,
             "OLMoE's attention_bias puts biases on all four projections or none (model.attn_out_bias="
             f"{m.attn_out_bias})"),
            (m.resolved_head_dim * m.n_heads != m.d_model, "model.head_dim", m.head_dim,
             "OLMoE's head dim is hidden_size / heads"),
            (m.n_shared_experts > 0, "model.n_shared_experts", m.n_shared_experts, "OLMoE has no shared experts"),
            (bool(m.dense_layer_ids), "model.dense_layers", m.dense_layer_ids, "every OLMoE layer is an MoE layer"),
        ]

    def hf_fields(self, m: ModelConfig) -> dict[str, Any]:
        return dict(intermediate_size=m.expert_hidden, num_experts=m.n_experts,
                    norm_topk_prob=bool(m.router.renormalize), attention_bias=bool(m.qkv_bias), clip_qkv=m.clip_qkv)
