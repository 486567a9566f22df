"""Conversion between our `Transformer` and the HF families (Mixtral, OLMoE, Qwen2-MoE, GPT-OSS,
Qwen3-MoE): configs, state dicts and in-memory models.

Our model has one parameter layout for every family (fused `qkv_proj`, stacked experts); the
tensor names on each side are one table (`moe/hf/tensor_map.py`), and what each family's config
means is its module in `moe/hf/families/`. A model a family cannot express is refused with a
ConfigError naming the option (`Family.check_expressible`); an HF config field our model cannot
reproduce, or one the converter does not know, is refused the same way (`Family.model_config`).

Training-only settings that HF lacks are not refused but do not survive the trip: the router
z-loss (`router.z_loss_coef`, 0 after an import) and our router-input jitter. `router_aux_loss_coef`
carries our coefficient over unchanged, but HF normalises its balance loss differently (its f_i
sums to top_k and it pools all layers), so training with it is not numerically our training.

API: `family`, `infer_family`, `hf_config`, `model_config_from_hf`, `to_hf_state_dict`,
`from_hf_state_dict`, `to_hf_model`, `from_hf_model`; `mixtral_config` and
`check_mixtral_compatible` for Mixtral. Directories in and out are `moe/hf/io.py` (reading,
shard by shard) and `moe/hf/commands.py` (`python -m moe.hf export|import`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from moe.config import ModelConfig
from moe.errors import ConfigError
from moe.hf.families import FAMILIES, family
from moe.hf.tensor_map import copy_hf_tensor_, hf_tensors, load_route
from moe.meta import meta_device
from moe.model import Transformer
from moe.weights import load_tensors_into

# The order `infer_family` tries: the plainest family that can express a model first.
EXPORT_ORDER = ("mixtral", "qwen3_moe", "olmoe", "qwen2_moe", "gpt_oss", "deepseek_v2", "deepseek_v3")


# ---------------------------------------------------------------------------- configs

def infer_family(model_cfg: ModelConfig) -> str:
    """The first family (in EXPORT_ORDER) that can express `model_cfg`; a ConfigError giving
    each family's reason when none can."""
    reasons = []
    for model_type in EXPORT_ORDER:
        try:
            family(model_type).check_expressible(model_cfg)
            return model_type
        except ConfigError as e:
            reasons.append(f"{model_type}: {e}")
    raise ConfigError("no HF family can express this model:\n  " + "\n  ".join(reasons))


def hf_config(model_cfg: ModelConfig, model_type: str = "mixtral", base: Optional[dict] = None,
              **extra: Any) -> PretrainedConfig:
    """The HF config (of family `model_type`) of a model built from `model_cfg`; see
    `Family.hf_config`. Special token ids default to None unless `base` or `extra` set them."""
    return family(model_type).hf_config(model_cfg, base=base, **extra)


def model_config_from_hf(config: PretrainedConfig, attention: str = "sdpa", experts: str = "sorted") -> ModelConfig:
    """Our ModelConfig (router included) of an HF config of any registered family."""
    if config.model_type not in FAMILIES:
        raise ConfigError(f"model_type={config.model_type!r} is not a family moe-lab converts; "
                          f"choose one of {sorted(FAMILIES)}")
    return family(config.model_type).model_config(config, attention=attention, experts=experts)


def mixtral_config(model_cfg: ModelConfig, **extra: Any) -> PretrainedConfig:
    """The `MixtralConfig` of `model_cfg` (special token ids None unless given in `extra`)."""
    return hf_config(model_cfg, "mixtral", **extra)


def check_mixtral_compatible(model_cfg: ModelConfig) -> None:
    """Raise ConfigError naming the first option that Mixtral cannot express."""
    family("mixtral").check_expressible(model_cfg)


# ---------------------------------------------------------------------------- state dicts

def to_hf_state_dict(model: Transformer, model_type: str = "mixtral", layout: str = "memory") -> dict[str, torch.Tensor]:
    """`model`'s weights under the HF names of `model_type` in `layout` ("memory": the HF
    model's own `state_dict`, `lm_head.weight` included even when tied; "hub": the files'
    per-expert names). The tensors are detached views of the model's own (no copy). Raises
    ConfigError if the family cannot express the model."""
    fam = family(model_type)
    fam.check_expressible(model.cfg)
    return hf_tensors(model.state_dict(), model.cfg, fam, layout)


def _check_keys_and_shapes(hf_sd: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                           optional: set[str], model_type: str) -> None:
    """Raise ValueError listing missing keys, unexpected keys and shape mismatches."""
    missing = sorted(set(expected) - set(hf_sd) - optional)
    unexpected = sorted(set(hf_sd) - set(expected))
    mismatched = [f"{k}: checkpoint {tuple(hf_sd[k].shape)} vs model {tuple(expected[k].shape)}"
                  for k in sorted(set(hf_sd) & set(expected)) if hf_sd[k].shape != expected[k].shape]
    if missing or unexpected or mismatched:
        problems = [f"{title} ({len(items)}): " + ", ".join(items)
                    for title, items in (("missing keys", missing), ("unexpected keys", unexpected),
                                         ("shape mismatches", mismatched)) if items]
        raise ValueError(f"HF {model_type} state dict does not match the model:\n  " + "\n  ".join(problems))


def from_hf_state_dict(hf_sd: dict[str, torch.Tensor], model: Transformer, model_type: str = "mixtral") -> Transformer:
    """Copy an HF model's `state_dict` (family `model_type`) into `model`, in place; returns it.

    Keys are checked strictly: a ValueError lists every missing key, unexpected key and shape
    mismatch. With tied embeddings `lm_head.weight` may be absent; if present it must equal the
    embedding. Values are cast to the model's dtype and device.
    """
    expected = to_hf_state_dict(model, model_type)  # (refuses a model the family cannot express)
    tied = model.cfg.tie_embeddings
    _check_keys_and_shapes(hf_sd, expected, {"lm_head.weight"} if tied else set(), model_type)
    if tied and "lm_head.weight" in hf_sd:
        embed = hf_sd["model.embed_tokens.weight"]
        if not torch.equal(hf_sd["lm_head.weight"].to(embed.device, embed.dtype), embed):
            raise ValueError("lm_head.weight differs from model.embed_tokens.weight, but the model ties "
                             "them (tie_embeddings=True); convert with tie_embeddings=False")
    with torch.no_grad():
        copy_hf_tensor_(model.state_dict(), model.cfg, family(model_type), hf_sd,
                        skip={"lm_head.weight"} if tied else ())
    return model


# --------------------------------------------------------------------------- models

def to_hf_model(model: Transformer, model_type: str = "mixtral", **extra: Any) -> PreTrainedModel:
    """An HF model of family `model_type` with a copy of `model`'s weights, in its dtype and on its
    device (eval mode). `extra` goes to the HF config (special token ids, `attn_implementation`, ...).

    HF's model is built on the meta device and given uninitialised storage on the target device:
    its random init of every weight (minutes and an fp32 copy for a large model) would be
    overwritten by the copy anyway. The buffers HF computes rather than stores (the rotary
    `inv_freq`) are computed by HF's own `_init_weights`, as its `from_pretrained` does."""
    param = next(model.parameters())
    config = hf_config(model.cfg, model_type, **extra)
    with meta_device():
        hf_model = AutoModelForCausalLM.from_config(config, dtype=param.dtype)
    hf_model.to_empty(device=param.device)
    hf_model.tie_weights()  # to_empty gives each module its own tensor: tie the embedding and LM head again
    owners = {name.rpartition(".")[0] for name, _ in hf_model.named_non_persistent_buffers()}
    with torch.no_grad():
        for owner in sorted(owners):
            hf_model._init_weights(hf_model.get_submodule(owner))
    hf_model.load_state_dict(to_hf_state_dict(model, model_type), strict=True)
    return hf_model.eval()


def from_hf_model(hf_model: PreTrainedModel, attention: str = "sdpa", experts: str = "sorted") -> Transformer:
    """Our `Transformer` (with the given attention backend and expert dispatch) holding a copy of
    `hf_model`'s weights, in its parameter dtype and on its device (eval mode). Only the
    parameters take HF's dtype: the rotary tables stay fp32, as our model builds them.

    Built on the meta device and filled tensor by tensor (`moe.weights.load_tensors_into`, the
    names of `moe/hf/tensor_map.py`): no random init and no fp32 copy, so the peak is the HF
    model plus ours in its dtype. To load a large model from disk, `moe.load_model(hf_dir)`
    needs no HF model at all."""
    model_type = hf_model.config.model_type
    model_cfg = model_config_from_hf(hf_model.config, attention=attention, experts=experts)
    param = next(hf_model.parameters())
    with meta_device():
        model = Transformer(model_cfg)
    pieces = ((name, lambda t=t: t.detach()) for name, t in hf_model.state_dict().items())
    load_tensors_into(model, pieces, load_route(model_cfg, family(model_type)), dtype=param.dtype, device=param.device)
    return model.eval()
