"""Quantizing a `Transformer` in place, and what a quantized checkpoint records.

    spec = QuantSpec("awq", group_size=128, calib_path="calib.txt", calib_tokens=4096)
    quantize_model(model, spec, calib_ids_BT)      # awq needs calibration tokens; the others do not

What is quantized: every attention projection (`qkv_proj`, `o_proj`), every expert (the grouped
3-D `gate_up_proj` / `down_proj`), and the dense SwiGLU FFNs (dense layers, shared experts).
What stays in full precision: the router (and the shared-expert gate), the embeddings, the LM
head, the norms. `QuantSpec("none")` changes nothing.

A quantized checkpoint is the single-file checkpoint (`moe/checkpoint.py`) with one more key,
`quantization` (the spec as a dict); its `model` state holds each quantized module's buffers
(`<module>.w_qweight`, `.w_scale`, `.w_zero`, `.in_scale`, ... see docs/guides/quantization.md).
`quantized_skeleton` rebuilds the module structure on the meta device so those load by name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch
from torch import nn

from moe.errors import ConfigError
from moe.experts import SwiGLUExperts
from moe.quant.awq import apply_awq
from moe.quant.modules import QuantExperts, QuantLinear, _Quantized
from moe.quant.schemes import QUANT_SCHEMES, Scheme, get_scheme

NONE = "none"


def allowed_schemes() -> list[str]:
    return [NONE, *QUANT_SCHEMES]


@dataclass
class QuantSpec:
    scheme: str = NONE
    group_size: int = 128  # int4 / awq: inputs per (scale, zero point)
    calib_path: Optional[str] = None  # awq: a text file of calibration text (required for awq)
    calib_tokens: int = 4096  # awq: calibration tokens
    n_grid: int = 20  # awq: alpha grid points

    def __post_init__(self):
        if self.scheme is None:
            self.scheme = NONE
        if not isinstance(self.scheme, str) or self.scheme not in allowed_schemes():
            raise ConfigError(f"quantization={self.scheme!r} is unknown; choose one of {allowed_schemes()}")
        for name in ("group_size", "calib_tokens", "n_grid"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"quant.{name}={v!r} must be a positive int")
        if self.group_size % 2:
            raise ConfigError(f"quant.group_size={self.group_size} must be even (two int4 codes per byte)")

    @property
    def enabled(self) -> bool:
        return self.scheme != NONE

    def build(self) -> Scheme:
        return get_scheme(self.scheme, self.group_size)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def coerce(cls, value) -> "QuantSpec":
        """A QuantSpec from a scheme name, a dict of fields, a QuantSpec, or None (= none)."""
        if isinstance(value, cls):
            return value
        if value is None or isinstance(value, str):
            return cls(value)
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(cls.__dataclass_fields__))
            if unknown:
                raise ConfigError(f"unknown quantization field(s) {unknown}; the fields are "
                                  f"{list(cls.__dataclass_fields__)}")
            return cls(**value)
        raise ConfigError(f"quantization={value!r} must be a scheme name, one of {allowed_schemes()}")


def _targets(model):
    """(parent module, attribute, module path) of everything a scheme quantizes."""
    for i, block in enumerate(model.layers):
        for name in ("qkv_proj", "o_proj"):
            yield block.attn, name, f"layers.{i}.attn.{name}"
        ffn = block.ffn
        dense = [(ffn, f"layers.{i}.ffn")] if not block.is_moe else (
            [(ffn.shared, f"layers.{i}.ffn.shared")] if ffn.shared is not None else [])
        for mod, path in dense:
            for name in ("gate_proj", "up_proj", "down_proj"):
                yield mod, name, f"{path}.{name}"
        if block.is_moe:
            yield ffn, "experts", f"layers.{i}.ffn.experts"


def _convert(model, scheme: Scheme, in_scales: dict[str, torch.Tensor], all_in_scales: bool) -> None:
    for parent, name, path in _targets(model):
        mod = getattr(parent, name)
        s = in_scales.get(path)
        if isinstance(mod, SwiGLUExperts):
            if s is None and all_in_scales:
                s = torch.ones(mod.n_experts, mod.d_model, device=mod.gate_up_proj.device)
            new: nn.Module = QuantExperts(scheme, mod.gate_up_proj, mod.down_proj, s)
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
        if calib_ids_BT is None:
            raise ConfigError(f"quantization={spec.scheme!r} needs calibration tokens (quant.calib_path)")
        in_scales = apply_awq(model, calib_ids_BT, scheme, spec.n_grid)
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
