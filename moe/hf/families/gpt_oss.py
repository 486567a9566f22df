"""GPT-OSS (`GptOssForCausalLM`, OpenAI's gpt-oss-20b / 120b): alternating sliding-window and full
attention layers (`layer_types`, `sliding_window`), a learned sink logit per head in every
attention softmax (`self_attn.sinks`), biases on q/k/v/o (`attention_bias`), a router with a bias
whose softmax runs over the top-k logits only (= our softmax top-k, renormalised), experts with
biases and the clamped SwiGLU (`swiglu_alpha`, `swiglu_limit`: our
`expert_activation="clamped_swiglu"`), YaRN rotary, every layer MoE, no shared expert.

Its experts are stored fused in both HF layouts (`mlp.experts.gate_up_proj [E, D, 2H]` with the
gate and up columns interleaved, `down_proj [E, H, D]`, and their biases); `tensor_transform`
turns them into ours. The published checkpoints store `gate_up_proj` / `down_proj` as MXFP4
(`*_blocks` / `*_scales`, `quantization_config.quant_method="mxfp4"`): `moe/hf/mxfp4.py`
dequantises them at load, or, with `quantization="mxfp4"` (moe.quant's `mxfp4` scheme, experts only),
keeps the stored bytes in the quantized experts. Export writes what the model holds: bf16 / fp32
experts without a `quantization_config`, or MXFP4 experts as `_blocks` / `_scales` with one."""

from __future__ import annotations

from typing import Any

import torch
from transformers import GptOssConfig

from moe.config import ModelConfig
from moe.hf.families.base import FAMILIES, Family, hf_layer_fields, layer_fields
from moe.hf.mxfp4 import dequantized_pieces, kept_route, kept_tensors

# transformers' / the published gpt-oss configs' MXFP4 record (what stays bf16: all but the experts)
MXFP4_CONFIG = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}


def _quant_method(c) -> Any:
    quant = getattr(c, "quantization_config", None)
    return (quant or {}).get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)


def _kept_spec(spec) -> bool:
    """`spec` is the experts-only mxfp4 scheme, whose stored layout is GPT-OSS's."""
    return spec is not None and spec.scheme == "mxfp4" and not spec.linear


def _gate_up_to_ours(t: torch.Tensor) -> torch.Tensor:  # [E, D, 2H] interleaved -> [E, 2H, D] gate rows first
    E, D, H2 = t.shape
    return t.reshape(E, D, H2 // 2, 2).permute(0, 3, 2, 1).reshape(E, H2, D)


def _gate_up_to_hf(t: torch.Tensor) -> torch.Tensor:
    E, H2, D = t.shape
    return t.reshape(E, 2, H2 // 2, D).permute(0, 3, 2, 1).reshape(E, D, H2)


def _bias_to_ours(t: torch.Tensor) -> torch.Tensor:  # [E, 2H] interleaved -> gate first
    E, H2 = t.shape
    return t.reshape(E, H2 // 2, 2).transpose(1, 2).reshape(E, H2)


def _bias_to_hf(t: torch.Tensor) -> torch.Tensor:
    E, H2 = t.shape
    return t.reshape(E, 2, H2 // 2).transpose(1, 2).reshape(E, H2)


def _transpose(t: torch.Tensor) -> torch.Tensor:  # down_proj: [E, H, D] <-> ours [E, D, H]
    return t.transpose(1, 2)


TRANSFORMS = {
    "experts.gate_up_proj": (_gate_up_to_ours, _gate_up_to_hf),
    "experts.gate_up_proj_bias": (_bias_to_ours, _bias_to_hf),
    "experts.down_proj": (_transpose, _transpose),
}


@FAMILIES.register("gpt_oss")
class GptOss(Family):
    model_type = "gpt_oss"
    display_name = "GPT-OSS"
    architecture = "GptOssForCausalLM"
    config_class = GptOssConfig
    expert_layout = "fused"
    window_support = "per_layer"
    mapped = frozenset({"intermediate_size", "num_local_experts", "sliding_window", "layer_types", "attention_bias",
                        "swiglu_alpha", "swiglu_limit", "quantization_config"})
    # The published config.json files also carry OpenAI's own names for two fields transformers
    # reads under its names; checked equal to those (input_refusals), never read.
    ignored = {"experts_per_token": "OpenAI's name for num_experts_per_tok (checked equal)",
               "initial_context_length": "OpenAI's name for the YaRN original_max_position_embeddings (checked equal)"}

    def stored_pieces(self, pieces, kept: bool = False):
        # MXFP4 `_blocks` / `_scales` pairs -> one dequantised tensor, unless kept as stored
        return pieces if kept else dequantized_pieces(pieces)

    def kept_quantization(self, c, spec) -> bool:
        return _quant_method(c) == "mxfp4" and _kept_spec(spec)

    def kept_route(self, route):
        return kept_route(route)

    def kept_tensors(self, state, hf_name, our_name):
        return kept_tensors(state, hf_name, our_name)

    def export_quantization(self, config, spec) -> None:
        if _kept_spec(spec):
            if _quant_method(config) != "mxfp4":
                config.quantization_config = dict(MXFP4_CONFIG)
        elif hasattr(config, "quantization_config"):  # an imported MXFP4 checkpoint, exported dequantised
            del config.quantization_config

    def tensor_transform(self, hf_name: str):
        return TRANSFORMS.get(hf_name.split(".mlp.", 1)[-1]) if ".mlp.experts." in hf_name else None

    def input_refusals(self, c) -> list:
        quant = getattr(c, "quantization_config", None)
        method = _quant_method(c)
        kinds = sorted(set(c.layer_types or []) - {"full_attention", "sliding_attention"})
        return [
            (quant is not None and method != "mxfp4", "quantization_config.quant_method", method,
             "only MXFP4 experts are read (dequantised at load, or kept with quantization='mxfp4')"),
            (bool(kinds), "layer_types", c.layer_types, f"layer kinds {kinds} are not full or sliding attention"),
            (getattr(c, "experts_per_token", c.num_experts_per_tok) != c.num_experts_per_tok, "experts_per_token",
             getattr(c, "experts_per_token", None), f"it differs from num_experts_per_tok={c.num_experts_per_tok}"),
            (getattr(c, "initial_context_length", None) not in (None, _original_length(c)), "initial_context_length",
             getattr(c, "initial_context_length", None),
             f"it differs from the rotary's original_max_position_embeddings={_original_length(c)}"),
        ]

    def model_fields(self, c) -> dict[str, Any]:
        return dict(n_experts=c.num_local_experts, expert_hidden=c.intermediate_size, qkv_bias=bool(c.attention_bias),
                    attn_out_bias=bool(c.attention_bias), attention_sinks=True, router_bias=True, expert_bias=True,
                    expert_activation="clamped_swiglu", swiglu_alpha=float(c.swiglu_alpha),
                    swiglu_limit=float(c.swiglu_limit), renormalize=True, **layer_fields(c))

    def feature_refusals(self, m: ModelConfig) -> list:
        return [
            (not m.attention_sinks, "model.attention_sinks", m.attention_sinks, "every GPT-OSS attention has sinks"),
            (not m.router_bias, "model.router_bias", m.router_bias, "GPT-OSS's router has a bias"),
            (not m.expert_bias, "model.expert_bias", m.expert_bias, "GPT-OSS's experts have biases"),
            (m.expert_activation != "clamped_swiglu", "model.expert_activation", m.expert_activation,
             "GPT-OSS's experts use the clamped SwiGLU"),
        ]

    def refusals(self, m: ModelConfig) -> list:
        return [
            (m.n_shared_experts > 0, "model.n_shared_experts", m.n_shared_experts, "GPT-OSS has no shared experts"),
            (bool(m.dense_layer_ids), "model.dense_layers", m.dense_layer_ids, "every GPT-OSS layer is an MoE layer"),
            (m.qk_norm != "none", "model.qk_norm", m.qk_norm, "GPT-OSS has no qk-norm"),
            (m.clip_qkv is not None, "model.clip_qkv", m.clip_qkv, "GPT-OSS does not clip q/k/v"),
            (m.qkv_bias != m.attn_out_bias, "model.qkv_bias", m.qkv_bias,
             f"GPT-OSS's attention_bias puts biases on all four projections or none (model.attn_out_bias="
             f"{m.attn_out_bias})"),
            (m.router.renormalize is not True, "router.renormalize", m.router.renormalize,
             "GPT-OSS's softmax runs over the top-k logits (renormalised)"),
        ]

    def hf_fields(self, m: ModelConfig) -> dict[str, Any]:
        layers = hf_layer_fields(m)
        return dict(intermediate_size=m.expert_hidden, num_local_experts=m.n_experts,
                    attention_bias=bool(m.qkv_bias), swiglu_alpha=m.swiglu_alpha, swiglu_limit=m.swiglu_limit,
                    layer_types=layers["layer_types"], sliding_window=layers["sliding_window"],
                    head_dim=m.resolved_head_dim)


def _original_length(c):
    scaling = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    return scaling.get("original_max_position_embeddings")
