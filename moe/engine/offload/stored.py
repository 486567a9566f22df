"""What of an experts module the cache moves, in the form it is stored, and how the module runs
on a fast tier's slots.

Three experts modules are offloadable, and each keeps every per-expert tensor with a leading
`[E, ...]` dim, so one rule covers them all:

* `SwiGLUExperts`: `gate_up_proj`, `down_proj`;
* `BiasedExperts` (GPT-OSS, `model.expert_bias` / `model.expert_activation`): those plus
  `gate_up_proj_bias`, `down_proj_bias` when present;
* `QuantExperts` (`quantization=` int4 / int8 / fp8 / fp8_weight / mxfp4 / awq): the stored tensors
  themselves (packed codes, scales, zero points, AWQ input scales, full-precision biases), never
  dequantised: a slot holds what the resident module holds, so a load moves the stored bytes.

A slot keeps each tensor's dtype as the resident engine would: a quantized module's buffers keep
theirs through `model.to(dtype)` (moe/quant/modules.py), anything else floating is cast to the
engine's dtype.

The compute is the module's own `forward`, on a shallow copy (`on_rows`) whose per-expert tensors
are the chunk's slot rows and whose `n_experts` is their count. Expert id `n_experts` marks a
dropped assignment in every dispatch, so tokens routed outside the chunk contribute nothing.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from moe.errors import ConfigError
from moe.experts import SwiGLUExperts
from moe.experts.biased import BiasedExperts
from moe.quant.modules import QuantExperts

OFFLOADABLE = (SwiGLUExperts, BiasedExperts, QuantExperts)


def check_experts(layer: int, experts: nn.Module) -> None:
    if type(experts) not in OFFLOADABLE:
        raise ConfigError(f"expert_cache supports {[c.__name__ for c in OFFLOADABLE]} experts; layer {layer}'s "
                          f"experts are {type(experts).__name__}: serve this model without expert_cache")


def _own_tensors(experts: nn.Module) -> dict[str, torch.Tensor]:
    return {**{k: v for k, v in experts._parameters.items() if v is not None},
            **{k: v for k, v in experts._buffers.items() if v is not None}}


def expert_tensors(experts: nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """name -> `[E, ...]` tensor on the host, in the dtype the resident engine computes with."""
    out = {}
    keep_dtype = isinstance(experts, QuantExperts)
    for name, t in _own_tensors(experts).items():
        if t.dim() == 0 or t.shape[0] != experts.n_experts:  # a layout the cache cannot slice per expert
            raise ConfigError(f"expert_cache: {type(experts).__name__}.{name} {tuple(t.shape)} has no leading "
                              f"expert dim of {experts.n_experts}; serve this model without expert_cache")
        t = t.detach()
        if t.is_floating_point() and not keep_dtype:
            t = t.to(dtype)
        out[name] = t.to("cpu").contiguous()
    return out


def expert_nbytes(experts: nn.Module, dtype: torch.dtype) -> int:
    """Stored bytes of one expert (what one load moves), from shapes only (works on meta tensors)."""
    keep_dtype = isinstance(experts, QuantExperts)
    size = torch.empty((), dtype=dtype).element_size()
    return sum(t[0].numel() * (size if t.is_floating_point() and not keep_dtype else t.element_size())
               for t in _own_tensors(experts).values())


def template(experts: nn.Module) -> nn.Module:
    """A copy of `experts` without its per-expert tensors (so the resident ones can be let go)."""
    t = copy.copy(experts)
    t._parameters = {k: v for k, v in experts._parameters.items() if v is None}
    t._buffers = {k: v for k, v in experts._buffers.items() if v is None}
    t._modules = dict(experts._modules)
    return t


def on_rows(tmpl: nn.Module, tensors: dict[str, torch.Tensor]) -> nn.Module:
    """`tmpl` computing with `tensors` (each `[R, ...]`: R experts, in the order of their ids)."""
    m = copy.copy(tmpl)
    m._parameters = dict(tmpl._parameters)
    m._buffers = {**tmpl._buffers, **tensors}
    m.n_experts = next(iter(tensors.values())).shape[0]
    return m
