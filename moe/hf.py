"""Conversion between our `Transformer` and HF transformers' Mixtral (`MixtralForCausalLM`).

Our model is laid out like Mixtral, so a conversion is a renaming plus one split: our fused
`qkv_proj` holds HF's `q_proj`, `k_proj` and `v_proj` rows in that order. The expert
tensors (`gate_up_proj [E, 2H, D]`, `down_proj [E, D, H]`) and the router gate `[E, D]`
are stored identically on both sides.

    ours                                  HF MixtralForCausalLM
    embed.weight                          model.embed_tokens.weight
    layers.{i}.attn_norm.weight           model.layers.{i}.input_layernorm.weight
    layers.{i}.attn.qkv_proj.weight       model.layers.{i}.self_attn.{q,k,v}_proj.weight (split)
    layers.{i}.attn.o_proj.weight         model.layers.{i}.self_attn.o_proj.weight
    layers.{i}.ffn_norm.weight            model.layers.{i}.post_attention_layernorm.weight
    layers.{i}.ffn.router.weight          model.layers.{i}.mlp.gate.weight
    layers.{i}.ffn.experts.gate_up_proj   model.layers.{i}.mlp.experts.gate_up_proj
    layers.{i}.ffn.experts.down_proj      model.layers.{i}.mlp.experts.down_proj
    norm.weight                           model.norm.weight
    lm_head.weight                        lm_head.weight

Only models Mixtral can express convert: `mixtral_config` refuses (with a `ConfigError`
naming the option) anything that would make the HF model compute something else at
inference. Training-only settings that Mixtral lacks are not refused but do not survive
the trip: the router z-loss (`router.z_loss_coef`) and our router-input jitter
(`router.jitter`; HF's `router_jitter_noise` also perturbs the experts' input, so it is
set to 0). `router_aux_loss_coef` carries our coefficient over unchanged, but HF
normalises its balance loss differently (its f_i sums to top_k and it pools all layers),
so training with it is not numerically our training.

API: `mixtral_config`, `model_config_from_hf`, `to_hf_state_dict`, `from_hf_state_dict`,
`to_hf_model`, `from_hf_model`.

CLI: `python -m moe.hf export <checkpoint> <out_dir>` and `python -m moe.hf import <hf_dir> <out_dir>`
(implemented in `moe/hf_io.py`, which also has `load_any`: a checkpoint or an HF directory).
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM

from moe.config import ConfigError, ModelConfig, RouterConfig, validate_model
from moe.model import Transformer

# MixtralConfig fields that `mixtral_config` derives from our configs; **extra may not set them.
_DERIVED_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "rope_parameters", "rope_theta",
    "rms_norm_eps", "tie_word_embeddings", "num_local_experts", "num_experts_per_tok",
    "router_aux_loss_coef", "router_jitter_noise", "sliding_window", "attention_dropout",
    "hidden_act", "initializer_range",
)


# ---------------------------------------------------------------------------- configs

def check_mixtral_compatible(model_cfg: ModelConfig, router_cfg: RouterConfig) -> None:
    """Raise ConfigError naming the first option that Mixtral cannot express."""
    m, r = model_cfg, router_cfg
    refusals = [
        (m.n_shared_experts > 0, "model.n_shared_experts", m.n_shared_experts,
         "Mixtral has no shared experts"),
        (m.n_dense_layers > 0, "model.n_dense_layers", m.n_dense_layers,
         "every Mixtral layer is an MoE layer"),
        (r.name != "topk", "router.name", r.name, "Mixtral routes with softmax top-k ('topk')"),
        (r.score_func != "softmax", "router.score_func", r.score_func, "Mixtral scores experts with a softmax"),
        (r.renormalize is not True, "router.renormalize", r.renormalize,
         "Mixtral always renormalises the top-k weights"),
        (r.temperature != 1, "router.temperature", r.temperature, "Mixtral's router has no temperature"),
        (r.n_groups > 1, "router.n_groups", r.n_groups, "Mixtral has no group-limited routing"),
        (r.capacity_factor is not None, "router.capacity_factor", r.capacity_factor,
         "Mixtral is dropless, so inference would differ from ours"),
    ]
    for refused, option, value, why in refusals:
        if refused:
            raise ConfigError(f"{option}={value!r} cannot be expressed as a Mixtral model: {why}")


def mixtral_config(model_cfg: ModelConfig, router_cfg: RouterConfig, **extra: Any) -> MixtralConfig:
    """The `MixtralConfig` of a model built from `model_cfg` and `router_cfg`.

    `extra` goes to `MixtralConfig` unchanged (e.g. `bos_token_id`, `eos_token_id`,
    `pad_token_id`, `attn_implementation`); the special token ids default to None rather
    than Mixtral's 1/2, since only the caller knows the tokenizer. Raises ConfigError for an
    option Mixtral cannot express, or for an `extra` key that would override a derived field.
    """
    check_mixtral_compatible(model_cfg, router_cfg)
    validate_model(model_cfg, router_cfg)
    if model_cfg.vocab_size is None:
        raise ConfigError("model.vocab_size=None: set it (the tokenizer's size) before converting")
    clash = sorted(set(extra) & set(_DERIVED_FIELDS))
    if clash:
        raise ConfigError(f"mixtral_config extra option(s) {clash} are derived from the model config; "
                          "change the ModelConfig/RouterConfig instead")
    m, r = model_cfg, router_cfg
    kwargs: dict[str, Any] = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    kwargs.update(extra)
    return MixtralConfig(
        vocab_size=m.vocab_size,
        hidden_size=m.d_model,
        intermediate_size=m.expert_hidden,
        num_hidden_layers=m.n_layers,
        num_attention_heads=m.n_heads,
        num_key_value_heads=m.n_kv_heads,
        head_dim=m.resolved_head_dim,
        max_position_embeddings=m.max_seq_len,
        rope_parameters={"rope_type": "default", "rope_theta": float(m.rope_theta)},
        rms_norm_eps=m.norm_eps,
        tie_word_embeddings=m.tie_embeddings,
        num_local_experts=m.n_experts,
        num_experts_per_tok=r.top_k,
        router_aux_loss_coef=r.aux_loss_coef,
        router_jitter_noise=0.0,
        sliding_window=None,
        attention_dropout=0.0,
        hidden_act="silu",
        initializer_range=m.init_std,
        **kwargs,
    )


def _rope_theta(config: MixtralConfig) -> float:
    """The rope theta of a config whose rotary is plain (default type, full head dim)."""
    params = dict(config.rope_parameters or {})
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    if rope_type != "default":
        raise ConfigError(f"rope_parameters.rope_type={rope_type!r} is not supported: our rotary is "
                          "the plain (unscaled) one, rope_type='default'")
    partial = params.pop("partial_rotary_factor", 1.0)
    if partial not in (None, 1, 1.0):
        raise ConfigError(f"rope_parameters.partial_rotary_factor={partial!r} is not supported: our "
                          "rotary covers the whole head dim")
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ConfigError("rope_parameters.rope_theta is missing")
    return float(theta)


def model_config_from_hf(config: MixtralConfig) -> tuple[ModelConfig, RouterConfig]:
    """The (ModelConfig, RouterConfig) of a Mixtral config: the inverse of `mixtral_config`.

    Refuses with a ConfigError what our model cannot reproduce: a sliding window, an
    activation other than SiLU, scaled or partial rotary, router input jitter, attention
    dropout. The router gets Mixtral's routing (softmax top-k, renormalised, dropless) and
    no z-loss, since Mixtral has none.
    """
    c = config
    refusals = [
        (c.sliding_window is not None, "sliding_window", c.sliding_window,
         "our attention is full causal attention"),
        (c.hidden_act != "silu", "hidden_act", c.hidden_act, "our experts are SwiGLU (silu)"),
        (c.router_jitter_noise != 0, "router_jitter_noise", c.router_jitter_noise,
         "HF jitters the experts' input too; our router.jitter only the router's"),
        (c.attention_dropout != 0, "attention_dropout", c.attention_dropout, "our attention has no dropout"),
    ]
    for refused, option, value, why in refusals:
        if refused:
            raise ConfigError(f"MixtralConfig.{option}={value!r} is not supported: {why}")
    default_head_dim = c.hidden_size // c.num_attention_heads
    head_dim = c.head_dim if c.head_dim not in (None, default_head_dim) else None
    model_cfg = ModelConfig(
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        n_kv_heads=c.num_key_value_heads,
        head_dim=head_dim,
        max_seq_len=c.max_position_embeddings,
        rope_theta=_rope_theta(c),
        norm_eps=c.rms_norm_eps,
        tie_embeddings=bool(c.tie_word_embeddings),
        n_experts=c.num_local_experts,
        expert_hidden=c.intermediate_size,
        n_shared_experts=0,
        n_dense_layers=0,
        init_std=c.initializer_range,
    )
    router_cfg = RouterConfig(
        name="topk",
        top_k=c.num_experts_per_tok,
        renormalize=True,
        aux_loss_coef=c.router_aux_loss_coef,
        z_loss_coef=0.0,
        temperature=1.0,
        jitter=0.0,
        capacity_factor=None,
        score_func="softmax",
    )
    validate_model(model_cfg, router_cfg)
    return model_cfg, router_cfg


# ---------------------------------------------------------------------- state dicts

def _renames(n_layers: int) -> Iterator[tuple[str, str]]:
    """(our name, HF name) of every tensor that maps one-to-one (all but qkv_proj)."""
    yield "embed.weight", "model.embed_tokens.weight"
    for i in range(n_layers):
        ours, hf = f"layers.{i}.", f"model.layers.{i}."
        yield ours + "attn_norm.weight", hf + "input_layernorm.weight"
        yield ours + "attn.o_proj.weight", hf + "self_attn.o_proj.weight"
        yield ours + "ffn_norm.weight", hf + "post_attention_layernorm.weight"
        yield ours + "ffn.router.weight", hf + "mlp.gate.weight"
        yield ours + "ffn.experts.gate_up_proj", hf + "mlp.experts.gate_up_proj"
        yield ours + "ffn.experts.down_proj", hf + "mlp.experts.down_proj"
    yield "norm.weight", "model.norm.weight"
    yield "lm_head.weight", "lm_head.weight"


def _qkv_sizes(cfg: ModelConfig) -> list[int]:
    """Row counts of q, k and v inside our fused qkv_proj."""
    d = cfg.resolved_head_dim
    return [cfg.n_heads * d, cfg.n_kv_heads * d, cfg.n_kv_heads * d]


def to_hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """`model`'s weights under `MixtralForCausalLM`'s parameter names.

    The tensors are detached views of the model's own (as `state_dict()` gives them), q/k/v
    being row slices of qkv_proj; `lm_head.weight` is included even when tied, as HF's
    state_dict does. Raises ConfigError if the model is not expressible as Mixtral.
    """
    check_mixtral_compatible(model.cfg, model.router_cfg)
    ours = model.state_dict()
    hf = {hf_name: ours[name].detach() for name, hf_name in _renames(model.cfg.n_layers)}
    for i in range(model.cfg.n_layers):
        q, k, v = ours[f"layers.{i}.attn.qkv_proj.weight"].detach().split(_qkv_sizes(model.cfg), dim=0)
        prefix = f"model.layers.{i}.self_attn."
        hf[prefix + "q_proj.weight"], hf[prefix + "k_proj.weight"], hf[prefix + "v_proj.weight"] = q, k, v
    return hf


def _check_keys_and_shapes(hf_sd: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                           optional: set[str]) -> None:
    """Raise ValueError listing missing keys, unexpected keys and shape mismatches."""
    missing = sorted(set(expected) - set(hf_sd) - optional)
    unexpected = sorted(set(hf_sd) - set(expected))
    mismatched = [f"{k}: checkpoint {tuple(hf_sd[k].shape)} vs model {tuple(expected[k].shape)}"
                  for k in sorted(set(hf_sd) & set(expected)) if hf_sd[k].shape != expected[k].shape]
    if missing or unexpected or mismatched:
        problems = [f"{title} ({len(items)}): " + ", ".join(items)
                    for title, items in (("missing keys", missing), ("unexpected keys", unexpected),
                                         ("shape mismatches", mismatched)) if items]
        raise ValueError("HF Mixtral state dict does not match the model:\n  " + "\n  ".join(problems))


def from_hf_state_dict(hf_sd: dict[str, torch.Tensor], model: Transformer) -> Transformer:
    """Copy a `MixtralForCausalLM` state dict into `model` (in place; returns `model`).

    Keys are checked strictly: a ValueError lists every missing key, unexpected key and
    shape mismatch. With tied embeddings `lm_head.weight` may be absent (as in saved
    checkpoints); if present it must equal the embedding. Values are cast to the model's
    dtype and device.
    """
    expected = to_hf_state_dict(model)  # (refuses a model Mixtral cannot express)
    tied = model.cfg.tie_embeddings
    _check_keys_and_shapes(hf_sd, expected, optional={"lm_head.weight"} if tied else set())
    ours = {name: hf_sd[hf_name] for name, hf_name in _renames(model.cfg.n_layers) if hf_name in hf_sd}
    if tied:
        embed = hf_sd["model.embed_tokens.weight"]
        head = hf_sd.get("lm_head.weight")
        if head is not None and not torch.equal(head.to(embed.device, embed.dtype), embed):
            raise ValueError("lm_head.weight differs from model.embed_tokens.weight, but the model ties "
                             "them (tie_embeddings=True); convert with tie_embeddings=False")
        ours["lm_head.weight"] = embed
    for i in range(model.cfg.n_layers):
        prefix = f"model.layers.{i}.self_attn."
        ours[f"layers.{i}.attn.qkv_proj.weight"] = torch.cat(
            [hf_sd[prefix + p] for p in ("q_proj.weight", "k_proj.weight", "v_proj.weight")], dim=0)
    model.load_state_dict(ours, strict=True)
    return model


# --------------------------------------------------------------------------- models

def to_hf_model(model: Transformer, **extra: Any) -> MixtralForCausalLM:
    """A `MixtralForCausalLM` with `model`'s weights, dtype and device (in eval mode).

    `extra` goes to `mixtral_config` (special token ids, `attn_implementation`, ...).
    """
    param = next(model.parameters())
    config = mixtral_config(model.cfg, model.router_cfg, **extra)
    hf_model = AutoModelForCausalLM.from_config(config, dtype=param.dtype).to(param.device)
    hf_model.load_state_dict(to_hf_state_dict(model), strict=True)
    return hf_model.eval()


def from_hf_model(hf_model: MixtralForCausalLM, attention: str = "sdpa", experts: str = "sorted") -> Transformer:
    """Our `Transformer` (with the given attention backend and expert dispatch) holding
    `hf_model`'s weights, in its parameter dtype and on its device (in eval mode).

    Only the parameters take HF's dtype: the rotary tables stay fp32, as our model builds them.
    """
    model_cfg, router_cfg = model_config_from_hf(hf_model.config)
    param = next(hf_model.parameters())
    model = Transformer(model_cfg, router_cfg, attention=attention, experts=experts).to(param.device)
    for p in model.parameters():  # (a tied table is one Parameter, so tying survives)
        p.data = p.data.to(param.dtype)
    from_hf_state_dict(hf_model.state_dict(), model)
    return model.eval()


# ------------------------------------------------------------------------------ CLI

if __name__ == "__main__":
    # `python -m moe.hf export <checkpoint> <out_dir>` / `python -m moe.hf import <hf_dir> <out_dir>`;
    # the commands live in moe/hf_io.py (export_hf, import_hf, load_any).
    import sys

    from moe.hf_io import main

    sys.exit(main())
