"""The modules a quantized model computes with: `QuantLinear` (for an `nn.Linear`) and
`QuantExperts` (for `SwiGLUExperts`, the grouped 3-D expert weights).

Both keep only the stored (quantized) tensors as buffers. On CUDA they run the Triton weight-only
GEMMs (`kernels.quant_gemm`, chosen by `moe/quant/dispatch.py`); elsewhere they dequantise one matmul's weight at a
time, in the activations' dtype: a linear's weight per call, and in `QuantExperts` one expert's
weights per expert that has tokens (never all E at once), so resident memory is the quantized
size plus one expert. The grouped-expert module is our own: torchao's quantized tensor
subclasses wrap 2-D `nn.Linear` weights and know no router-dispatched [E, O, I] tensors.

The buffers (codes, fp32 scales, zero points, AWQ input scales) keep their dtype through
`model.to(dtype)`: only their device follows (see `_apply`), so an fp32 scale is never rounded
to bf16 and E4M3 bytes are never "cast" as if they were values.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from moe.experts.biased import clamped_swiglu
from moe.experts.loop import loop_over_experts
from moe.quant import dispatch
from moe.quant.schemes import Scheme, quantize_activation

# Full-precision buffers of a quantized module whose names share a stored prefix (GPT-OSS's expert
# biases keep `BiasedExperts`' names, so HF tensor names map to them unchanged).
FULL_PRECISION = frozenset({"gate_up_proj_bias", "down_proj_bias"})


class _Quantized(nn.Module):
    scheme: Scheme

    def _set(self, prefix: str, tensors: dict[str, torch.Tensor]) -> None:
        for k, v in tensors.items():
            self.register_buffer(f"{prefix}{k}", v)

    def _get(self, prefix: str, index: Optional[int] = None) -> dict[str, torch.Tensor]:
        out = {}
        for k, v in self._buffers.items():
            if k.startswith(prefix) and k not in FULL_PRECISION:
                out[k[len(prefix):]] = v if index is None else v[index]
        return out

    def _apply(self, fn, recurse=True):
        # Follow the model's device, never its dtype (see the module docstring).
        for name, b in self._buffers.items():
            if b is not None:
                self._buffers[name] = b.to(fn(torch.empty(0, device=b.device)).device)
        return self

    def quantized_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values() if b is not None)


class QuantLinear(_Quantized):
    """y = x @ dequant(W)^T + b. `in_scale` (AWQ, where the scale could not be folded into the
    layer before): the input is multiplied by it first."""

    def __init__(self, scheme: Scheme, weight_OI: torch.Tensor, bias_O: Optional[torch.Tensor],
                 in_scale_I: Optional[torch.Tensor] = None):
        super().__init__()
        self.scheme = scheme
        self.out_features, self.in_features = weight_OI.shape
        self._set("w_", scheme.quantize(weight_OI.detach()))
        self.register_buffer("bias", None if bias_O is None else bias_O.detach().float().clone())
        self.register_buffer("in_scale", None if in_scale_I is None else in_scale_I.detach().float().clone())

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.scheme.dequantize(self._get("w_"), self.in_features, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_scale is not None:
            x = x * self.in_scale.to(x.dtype)
        if dispatch.use_kernels(self.scheme, x):  # CUDA: dequantised inside the Triton GEMM
            w = dispatch.quant_weight(self.scheme, self._get("w_"), self.in_features)
            return dispatch.linear(x, w, self.bias, self.scheme.act_fp8)
        if self.scheme.act_fp8:
            x = quantize_activation(x)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dequantized_weight(x.dtype), bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, scheme={self.scheme.name}"


class QuantExperts(_Quantized):
    """Quantized `SwiGLUExperts` or `BiasedExperts`: `gate_up [E, 2H, D]` and `down [E, D, H]` stored
    per scheme. Dispatch is the `loop` reference (moe/experts/loop.py) with one expert's weights
    dequantised at a time; `in_scale [E, D]` (AWQ) multiplies each expert's inputs (one scale vector per
    expert cannot be folded into the norm all experts and the router share). From `BiasedExperts`
    (GPT-OSS): the biases (`gate_up_proj_bias [E, 2H]`, `down_proj_bias [E, D]`, full precision) and
    the activation (`swiglu` or `clamped_swiglu` with its alpha and limit), computed as it does."""

    def __init__(self, scheme: Scheme, gate_up_E2HD: torch.Tensor, down_EDH: torch.Tensor,
                 in_scale_ED: Optional[torch.Tensor] = None, *, gate_up_bias_E2H: Optional[torch.Tensor] = None,
                 down_bias_ED: Optional[torch.Tensor] = None, activation: str = "swiglu", alpha: float = 1.702,
                 limit: float = 7.0):
        super().__init__()
        self.scheme = scheme
        self.n_experts, two_h, self.d_model = gate_up_E2HD.shape
        self.hidden = two_h // 2
        self.activation, self.alpha, self.limit = activation, alpha, limit
        self._set("gate_up_", scheme.quantize(gate_up_E2HD.detach()))
        self._set("down_", scheme.quantize(down_EDH.detach()))
        self.register_buffer("in_scale", None if in_scale_ED is None else in_scale_ED.detach().float().clone())
        for name, bias in (("gate_up_proj_bias", gate_up_bias_E2H), ("down_proj_bias", down_bias_ED)):
            self.register_buffer(name, None if bias is None else bias.detach().float().clone())

    @property
    def plain_swiglu(self) -> bool:
        """No biases and silu(gate) * up: what the quantized gather-GEMM path computes."""
        return self.activation == "swiglu" and self.gate_up_proj_bias is None and self.down_proj_bias is None

    def act(self, gate_up_N2H: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up_N2H.chunk(2, dim=-1)
        if self.activation == "clamped_swiglu":
            return clamped_swiglu(gate, up, self.alpha, self.limit)
        return F.silu(gate) * up

    def _bias(self, name: str, e: int, dtype: torch.dtype) -> Optional[torch.Tensor]:
        bias = getattr(self, name)
        return None if bias is None else bias[e].to(dtype)

    def expert_weights(self, e: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [2H, D], down [D, H]) of expert e, dequantised."""
        s = self.scheme
        return (s.dequantize(self._get("gate_up_", e), self.d_model, dtype),
                s.dequantize(self._get("down_", e), self.hidden, dtype))

    def forward(self, x_TD: torch.Tensor, experts_TK: torch.Tensor, weights_TK: torch.Tensor) -> torch.Tensor:
        if dispatch.use_kernels(self.scheme, x_TD):  # CUDA: the quantized gather-GEMM (moe/quant/dispatch.py)
            s = self.scheme
            return dispatch.experts(x_TD, experts_TK, weights_TK,
                                    dispatch.quant_weight(s, self._get("gate_up_"), self.d_model),
                                    dispatch.quant_weight(s, self._get("down_"), self.hidden), self.in_scale,
                                    s.act_fp8, None if self.plain_swiglu else self)
        def expert(e, x_ND):
            gate_up, down = self.expert_weights(e, x_TD.dtype)
            if self.in_scale is not None:
                x_ND = x_ND * self.in_scale[e].to(x_ND.dtype)
            if self.scheme.act_fp8:
                x_ND = quantize_activation(x_ND)
            h = self.act(F.linear(x_ND, gate_up, self._bias("gate_up_proj_bias", e, x_ND.dtype)))
            if self.scheme.act_fp8:
                h = quantize_activation(h)
            return F.linear(h, down, self._bias("down_proj_bias", e, h.dtype))

        return loop_over_experts(x_TD, experts_TK, weights_TK, self.n_experts, expert)

    def extra_repr(self) -> str:
        return (f"n_experts={self.n_experts}, d_model={self.d_model}, hidden={self.hidden}, scheme={self.scheme.name}, "
                f"activation={self.activation}, bias={self.gate_up_proj_bias is not None}")
