"""Mixtral (`MixtralForCausalLM`, Mistral AI's Mixtral-8x7B / 8x22B): softmax top-k, always
renormalised, no biases, no qk-norm, no shared experts, every layer MoE. On disk its MoE block is
`block_sparse_moe` and the experts' gate / up / down projections are `w1` / `w3` / `w2`."""

from __future__ import annotations

from typing import Any

from transformers import MixtralConfig

from moe.config import ModelConfig
from moe.hf.families.base import FAMILIES, Family


@FAMILIES.register("mixtral")
class Mixtral(Family):
    model_type = "mixtral"
    display_name = "Mixtral"
    architecture = "MixtralForCausalLM"
    config_class = MixtralConfig
    moe_module = "block_sparse_moe"
    expert_names = ("w1", "w3", "w2")
    window_support = "uniform"
    mapped = frozenset({"intermediate_size", "num_local_experts", "sliding_window", "router_jitter_noise"})

    def input_refusals(self, c) -> list:
        return [
            (c.router_jitter_noise != 0, "router_jitter_noise", c.router_jitter_noise,
             "HF jitters the experts' input too; our router.jitter only the router's"),
        ]

    def model_fields(self, c) -> dict[str, Any]:
        # HF's sliding_window (when set) masks every layer alike: our layer_types=None with a window
        return dict(n_experts=c.num_local_experts, expert_hidden=c.intermediate_size, renormalize=True,
                    sliding_window=c.sliding_window)

    def refusals(self, m: ModelConfig) -> list:
        return [
            (m.n_shared_experts > 0, "model.n_shared_experts", m.n_shared_experts, "Mixtral has no shared experts"),
            (m.n_dense_layers > 0, "model.n_dense_layers", m.n_dense_layers, "every Mixtral layer is an MoE layer"),
            (bool(m.dense_layers), "model.dense_layers", list(m.dense_layers), "every Mixtral layer is an MoE layer"),
            (m.qk_norm != "none", "model.qk_norm", m.qk_norm, "Mixtral has no qk-norm"),
            (m.qkv_bias, "model.qkv_bias", m.qkv_bias, "Mixtral's projections have no biases"),
            (m.attn_out_bias, "model.attn_out_bias", m.attn_out_bias, "Mixtral's projections have no biases"),
            (m.clip_qkv is not None, "model.clip_qkv", m.clip_qkv, "Mixtral does not clip q/k/v"),
            (m.router.renormalize is not True, "router.renormalize", m.router.renormalize,
             "Mixtral always renormalises the top-k weights"),
        ]

    def hf_fields(self, m: ModelConfig) -> dict[str, Any]:
        return dict(intermediate_size=m.expert_hidden, num_local_experts=m.n_experts, sliding_window=m.layer_window(0),
                    router_jitter_noise=0.0)
