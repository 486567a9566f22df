"""DeepSeek-V2 (`DeepseekV2ForCausalLM`: DeepSeek-V2, V2-Lite, V2.5): Multi-head Latent Attention
(`model.attention_kind=mla`, moe/attention/mla.py; the rotary pairs interleaved, as HF's complex
rotation turns them), `first_k_dense_replace` dense layers (width `intermediate_size`) then MoE
layers of `n_routed_experts` fine-grained experts plus `n_shared_experts` shared ones (one FFN of
n_shared x moe_intermediate_size), softmax routing without renormalisation, the weights times
`routed_scaling_factor`; `topk_method` greedy or group_limited_greedy (`n_group` groups, a token
keeps its `topk_group` best, a group scored by its best expert).

transformers' DeepSeek-V2 ignores `norm_topk_prob` (DeepSeek's own code renormalised when it was
set; every published V2 config has it false): true is refused rather than guessed. Fields of
DeepSeek's remote-code configs that HF keeps as extra attributes are read too (`scoring_func`,
`moe_layer_freq`) or ignored with the reason (`ep_size`, `aux_loss_alpha`, `seq_aux`).
"""

from __future__ import annotations

from typing import Any

from transformers import DeepseekV2Config

from moe.config import ModelConfig
from moe.hf.families.base import FAMILIES, Family
from moe.routing.routers import router_config

MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@FAMILIES.register("deepseek_v2")
class DeepseekV2(Family):
    model_type = "deepseek_v2"
    display_name = "DeepSeek-V2"
    architecture = "DeepseekV2ForCausalLM"
    config_class = DeepseekV2Config
    shared_module = "shared_experts"
    unwritten = frozenset({"router_aux_loss_coef"})  # DeepSeek's balance losses are training-only fields
    head_dim_field = "never"  # HF derives head_dim (= qk_rope_head_dim) itself
    mapped = frozenset({"intermediate_size", "moe_intermediate_size", "n_routed_experts", "n_shared_experts",
                        "first_k_dense_replace", "routed_scaling_factor", "n_group", "topk_group", "topk_method",
                        "norm_topk_prob", "attention_bias", "mlp_bias", "scoring_func", "moe_layer_freq",
                        *MLA_FIELDS})
    ignored = {
        "qk_head_dim": "derived by HF: qk_nope_head_dim + qk_rope_head_dim",
        "pretraining_tp": "a tensor-parallel split of the original training; HF's forward never reads it",
        "ep_size": "the expert-parallel size of DeepSeek's own training code",
        "aux_loss_alpha": "a training-time balance-loss coefficient; no effect on logits",
        "seq_aux": "switches DeepSeek's sequence-wise balance loss in training; no effect on logits",
    }
    topk_methods = ("greedy", "group_limited_greedy")
    scoring = "softmax"

    def input_refusals(self, c) -> list:
        method = getattr(c, "topk_method", self.topk_methods[0])
        return [
            (c.num_key_value_heads != c.num_attention_heads, "num_key_value_heads", c.num_key_value_heads,
             "MLA gives every head its own key and value (num_key_value_heads = num_attention_heads)"),
            (bool(c.attention_bias), "attention_bias", c.attention_bias, "our MLA projections have no biases"),
            (bool(getattr(c, "mlp_bias", False)), "mlp_bias", getattr(c, "mlp_bias", None), "our FFNs have no biases"),
            (method not in self.topk_methods, "topk_method", method,
             f"{self.display_name} routes with {list(self.topk_methods)}"),
            (getattr(c, "scoring_func", self.scoring) != self.scoring, "scoring_func", getattr(c, "scoring_func", None),
             f"transformers' {self.display_name} scores experts with a {self.scoring}"),
            (getattr(c, "moe_layer_freq", 1) != 1, "moe_layer_freq", getattr(c, "moe_layer_freq", None),
             "transformers makes every layer from first_k_dense_replace on an MoE layer"),
            (self.model_type == "deepseek_v2" and bool(c.norm_topk_prob), "norm_topk_prob", c.norm_topk_prob,
             "transformers' DeepSeek-V2 ignores it (never renormalises) while DeepSeek's code renormalises"),
        ]

    def model_fields(self, c) -> dict[str, Any]:
        return dict(
            n_kv_heads=c.num_attention_heads, head_dim=None, attention_kind="mla",
            **{k: getattr(c, k) for k in MLA_FIELDS}, rope_interleave=bool(getattr(c, "rope_interleave", True)),
            n_experts=c.n_routed_experts, expert_hidden=c.moe_intermediate_size, dense_hidden=c.intermediate_size,
            n_dense_layers=min(c.first_k_dense_replace, c.num_hidden_layers), n_shared_experts=c.n_shared_experts or 0,
            routed_scaling_factor=float(c.routed_scaling_factor), renormalize=bool(c.norm_topk_prob))

    def router_config(self, c, fields: dict[str, Any]):
        fields.pop("renormalize")
        grouped = getattr(c, "topk_method", "greedy") == "group_limited_greedy"
        return router_config("topk", top_k=c.num_experts_per_tok, renormalize=False,
                             aux_loss_coef=getattr(c, "router_aux_loss_coef", 0.0), z_loss_coef=0.0,
                             n_groups=c.n_group if grouped else 1, topk_groups=c.topk_group if grouped else 1)

    def router_refusals(self, m: ModelConfig) -> list:
        r = m.router
        return [
            (r.name != "topk", "router.name", r.name, "DeepSeek-V2 routes with a softmax top-k ('topk')"),
            (r.renormalize, "router.renormalize", r.renormalize, "transformers' DeepSeek-V2 never renormalises"),
            (r.n_groups > 1 and r.group_score_top != 1, "router.group_score_top", r.group_score_top,
             "DeepSeek-V2 scores a group by its best expert"),
            *self.shared_router_refusals(m),
        ]

    def shared_router_refusals(self, m: ModelConfig) -> list:
        r = m.router
        return [
            (r.temperature != 1, "router.temperature", r.temperature, "DeepSeek's router has no temperature"),
            (r.capacity_factor is not None, "router.capacity_factor", r.capacity_factor,
             "DeepSeek is dropless, so inference would differ from ours"),
            (bool(r.drop_experts), "router.drop_experts", list(r.drop_experts),
             "an inference-time ablation HF configs cannot state"),
            (m.attention_kind != "mla", "model.attention_kind", m.attention_kind, "DeepSeek's attention is MLA"),
        ]

    def refusals(self, m: ModelConfig) -> list:
        dense = m.dense_layer_ids
        return [
            (dense != list(range(len(dense))), "model.dense_layers", dense,
             "DeepSeek's dense layers are the first first_k_dense_replace"),
            (m.shared_expert_hidden not in (None, m.n_shared_experts * m.expert_hidden), "model.shared_expert_hidden",
             m.shared_expert_hidden, "DeepSeek's shared FFN is n_shared_experts x moe_intermediate_size wide"),
            (m.shared_expert_gate, "model.shared_expert_gate", m.shared_expert_gate, "DeepSeek has no shared gate"),
            (self.model_type == "deepseek_v2" and not m.rope_interleave, "model.rope_interleave", m.rope_interleave,
             "DeepSeek-V2 always rotates interleaved pairs"),
            (self.model_type == "deepseek_v2" and m.mtp_depth > 0, "model.mtp_depth", m.mtp_depth,
             "DeepSeek-V2 has no multi-token-prediction layers (deepseek_v3 has)"),
        ]

    def hf_fields(self, m: ModelConfig) -> dict[str, Any]:
        r = m.router
        grouped = r.n_groups > 1
        return dict(**self.shared_hf_fields(m), topk_method="group_limited_greedy" if grouped else "greedy",
                    n_group=r.n_groups if grouped else None, topk_group=r.topk_groups if grouped else None,
                    norm_topk_prob=False)

    def shared_hf_fields(self, m: ModelConfig) -> dict[str, Any]:
        return dict(**{k: getattr(m, k) for k in MLA_FIELDS}, n_routed_experts=m.n_experts,
                    moe_intermediate_size=m.expert_hidden, intermediate_size=m.dense_hidden or
                    m.expert_hidden * m.router.top_k, first_k_dense_replace=m.n_dense_layers or len(m.dense_layer_ids),
                    n_shared_experts=m.n_shared_experts, routed_scaling_factor=m.routed_scaling_factor,
                    attention_bias=False)
