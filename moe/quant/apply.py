"""Quantizing a `Transformer` in place, and what a quantized checkpoint records.

    spec = QuantSpec("awq", group_size=128, calib_path="calib.txt", calib_tokens=4096)  # the scheme's own options
    quantize_model(model, spec, calib_ids_BT)      # awq needs calibration tokens; the others do not

What is quantized: every attention projection (every `nn.Linear` of a block's attention: `qkv_proj`,
`o_proj`; MLA's `q_proj` or `q_a_proj`/`q_b_proj`, `kv_a_proj`, `kv_b_proj`, `o_proj`), every expert (the grouped
3-D `gate_up_proj` / `down_proj`), and the dense SwiGLU FFNs (dense layers, shared experts).
What stays in full precision: the router (and the shared-expert gate), the embeddings, the LM
head, the norms. `QuantSpec("none")` changes nothing.

A quantized checkpoint is the single-file checkpoint (`moe/checkpoint.py`) with one more key,
`quantization` (the spec as a dict); its `model` state holds each quantized module's buffers
(`<module>.w_qweight`, `.w_scale`, `.w_zero`, `.in_scale`, ... see docs/guides/quantization.md).
`quantized_skeleton` rebuilds the module structure on the meta device so those load by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import torch
from torch import nn

from moe.errors import ConfigError
from moe.experts import BiasedExperts, SwiGLUExperts
from moe.quant.awq import apply_awq
from moe.quant.modules import QuantExperts, QuantLinear, _Quantized
from moe.quant.schemes import QUANT_SCHEMES, Scheme

NONE = "none"


def allowed_schemes() -> list[str]:
    return [NONE, *QUANT_SCHEMES]


class QuantSpec:
    """A scheme name and its options: `QuantSpec("int4", group_size=64)`. The options are merged
    onto the scheme's own `Config` (`moe/quant/schemes/<name>.py`); one the scheme does not have
    is a ConfigError naming it and the scheme's options (`QuantSpec("int8", group_size=64)`)."""

    def __init__(self, scheme: Optional[str] = NONE, **options: Any):
        self.scheme = NONE if scheme is None else scheme
        if not isinstance(self.scheme, str) or self.scheme not in allowed_schemes():
            raise ConfigError(f"quantization={self.scheme!r} is unknown; choose one of {allowed_schemes()}")
        if self.scheme == NONE:
            if options:
                raise ConfigError(f"{', '.join(f'quant.{k}' for k in sorted(options))}: not an option of "
                                  f"quantization='none'; it has no options")
            self.options = None
        else:
            self.options = QUANT_SCHEMES.make_config(self.scheme, options, "quant")

    def __getattr__(self, name: str) -> Any:
        """The scheme's options read as attributes (`spec.calib_path` of an awq spec)."""
        options = self.__dict__.get("options")
        if options is not None and name in {f.name for f in dataclasses.fields(options)}:
            return getattr(options, name)
        raise AttributeError(f"quantization={self.__dict__.get('scheme')!r} has no option {name!r}")

    @property
    def enabled(self) -> bool:
        return self.scheme != NONE

    def build(self) -> Scheme:
        return QUANT_SCHEMES.lookup(self.scheme)(self.options)

    def as_dict(self) -> dict:
        """The record a quantized checkpoint keeps: the scheme and its options, flat."""
        return {"scheme": self.scheme, **(dataclasses.asdict(self.options) if self.options is not None else {})}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, QuantSpec) and self.as_dict() == other.as_dict()

    def __repr__(self) -> str:
        return f"QuantSpec({', '.join(f'{k}={v!r}' for k, v in self.as_dict().items())})"

    @classmethod
    def coerce(cls, value) -> "QuantSpec":
        """A QuantSpec from a scheme name, a dict `{"scheme": ..., <option>: ...}`, a QuantSpec, or None (= none)."""
        if isinstance(value, cls):
            return value
        if value is None or isinstance(value, str):
            return cls(value)
        if isinstance(value, Mapping):
            options = dict(value)
            return cls(options.pop("scheme", NONE), **options)
        raise ConfigError(f"quantization={value!r} must be a scheme name, one of {allowed_schemes()}")

    @classmethod
    def from_record(cls, record: Optional[Mapping]) -> "QuantSpec":
        """The spec a quantized checkpoint recorded. Records written before each scheme owned its
        options hold every scheme's fields; those the scheme does not have were ignored when it
        was quantized, so they are dropped here (a user's spec keeps refusing them)."""
        if not record:
            return cls(NONE)
        scheme = record.get("scheme") or NONE
        own = set(QUANT_SCHEMES.option_names(scheme)) if scheme in QUANT_SCHEMES else set()
        return cls(scheme, **{k: v for k, v in record.items() if k in own})


def sweep_specs(schemes: list[str], options: Mapping[str, Any], prefix: str = "quant") -> dict[str, QuantSpec]:
    """The specs of a comparison of `schemes` sharing `options`: each scheme takes the options it
    has; an option none of them has is a ConfigError naming it and each scheme's options."""
    owned = {s: QUANT_SCHEMES.option_names(s) if s != NONE and s in QUANT_SCHEMES else [] for s in schemes}
    unused = sorted(set(options) - {o for names in owned.values() for o in names})
    if unused:
        raise ConfigError(f"{', '.join(f'{prefix}.{k}' for k in unused)}: not an option of any compared scheme; "
                          f"their options are {owned}")
    return {s: QuantSpec(s, **{k: v for k, v in options.items() if k in owned[s]}) for s in schemes}


def _targets(model, linears: bool = True):
    """(parent module, attribute, module path) of everything a scheme quantizes (`linears=False`:
    the experts only)."""
    for i, block in enumerate(model.layers):
        for name, mod in block.attn.named_children() if linears else ():  # whichever attention the block has
            if isinstance(mod, nn.Linear):
                yield block.attn, name, f"layers.{i}.attn.{name}"
        ffn = block.ffn
        dense = [] if not linears else [(ffn, f"layers.{i}.ffn")] if not block.is_moe else (
            [(ffn.shared, f"layers.{i}.ffn.shared")] if ffn.shared is not None else [])
        for mod, path in dense:
            for name in ("gate_proj", "up_proj", "down_proj"):
                yield mod, name, f"{path}.{name}"
        if block.is_moe:
            yield ffn, "experts", f"layers.{i}.ffn.experts"


def _convert(model, scheme: Scheme, in_scales: dict[str, torch.Tensor], all_in_scales: bool) -> None:
    for parent, name, path in _targets(model, scheme.quantizes_linears):
        mod = getattr(parent, name)
        s = in_scales.get(path)
        if isinstance(mod, BiasedExperts):  # GPT-OSS: biases and activation carried over (AWQ is refused before)
            new: nn.Module = QuantExperts(scheme, mod.gate_up_proj, mod.down_proj, s,
                                          gate_up_bias_E2H=mod.gate_up_proj_bias, down_bias_ED=mod.down_proj_bias,
                                          activation=mod.activation, alpha=mod.alpha, limit=mod.limit)
        elif isinstance(mod, SwiGLUExperts):
            if s is None and all_in_scales:
                s = torch.ones(mod.n_experts, mod.d_model, device=mod.gate_up_proj.device)
            new = QuantExperts(scheme, mod.gate_up_proj, mod.down_proj, s)
        elif isinstance(mod, nn.Linear):
            if s is None and all_in_scales:
                s = torch.ones(mod.in_features, device=mod.weight.device)
            new = QuantLinear(scheme, mod.weight, mod.bias, s)
        else:
            raise TypeError(f"{path} is a {type(mod).__name__}: already quantized?")
        setattr(parent, name, new)


def quantize_model(model, spec, calib_ids_BT: Optional[torch.Tensor] = None):
    """Quantize `model` in place per `spec` (a QuantSpec, a name, a dict); returns it. AWQ
    needs `calib_ids_BT` (token ids [B, T]) and searches on the model's current weights."""
    spec = QuantSpec.coerce(spec)
    if not spec.enabled:
        return model
    scheme = spec.build()
    in_scales: dict[str, torch.Tensor] = {}
    if scheme.searches_scales:
        if model.cfg.attention_kind != "mha":  # AWQ folds its attention scales into the fused qkv_proj
            raise ConfigError(f"quantization={spec.scheme!r} is not supported with model.attention_kind="
                              f"{model.cfg.attention_kind!r}: its scale search folds into grouped-query attention's "
                              "fused qkv_proj; use an RTN scheme (int8, int4, fp8, fp8_weight)")
        cfg = model.cfg
        if cfg.expert_bias or cfg.expert_activation != "swiglu":  # the search models plain SwiGLU experts
            raise ConfigError(f"quantization={spec.scheme!r} is not supported with model.expert_activation="
                              f"{cfg.expert_activation!r} / model.expert_bias={cfg.expert_bias!r} (GPT-OSS experts): "
                              "its scale search models plain SwiGLU experts; use an RTN scheme (mxfp4, int4, int8, "
                              "fp8)")
        if calib_ids_BT is None:
            raise ConfigError(f"quantization={spec.scheme!r} needs calibration tokens (quant.calib_path)")
        in_scales = apply_awq(model, calib_ids_BT, scheme, spec.options.n_grid)
    _convert(model, scheme, in_scales, all_in_scales=scheme.searches_scales)
    model.quant_spec = spec
    return model


def quantized_skeleton(model, spec) -> None:
    """Give a (meta-device) float `model` the module structure of `quantize_model(model, spec)`
    without computing anything, so that a quantized state dict loads into it by name."""
    spec = QuantSpec.coerce(spec)
    if spec.enabled:
        scheme = spec.build()
        _convert(model, scheme, {}, all_in_scales=scheme.searches_scales)
        model.quant_spec = spec


def weight_bytes(model) -> dict[str, int]:
    """Bytes of the model's weights: `quantized` (the stored codes, scales, zero points),
    `full_precision` (every parameter and buffer outside the quantized modules), `total`."""
    quant = sum(m.quantized_bytes() for m in model.modules() if isinstance(m, _Quantized))
    seen: set[int] = set()
    full = 0
    for mod in model.modules():
        if isinstance(mod, _Quantized):
            continue
        for t in list(mod.parameters(recurse=False)) + [b for b in mod.buffers(recurse=False) if b is not None]:
            if id(t) not in seen:  # a tied LM head counts once
                seen.add(id(t))
                full += t.numel() * t.element_size()
    return {"quantized": quant, "full_precision": full, "total": quant + full}
