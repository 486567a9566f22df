"""fp8_weight: E4M3 weights with one fp32 scale per output channel (s = amax / 448); activations
left in full precision."""

from __future__ import annotations

import torch

from moe.quant.schemes.base import EPS, FP8_DTYPE, FP8_MAX, QUANT_SCHEMES, Scheme


@QUANT_SCHEMES.register("fp8_weight")
class FP8Weight(Scheme):
    """E4M3 weights, one fp32 scale per output channel; stored as the E4M3 bytes (uint8), so that
    `model.to(dtype)` (which casts every floating-point tensor) cannot touch them."""

    name, bits, kernel_format = "fp8_weight", 8, "fp8"

    def quantize(self, w):
        w = w.float()
        scale = (w.abs().amax(-1, keepdim=True) / FP8_MAX).clamp(min=EPS)
        return {"qweight": (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).view(torch.uint8), "scale": scale}

    def dequantize(self, q, in_features, dtype):
        return (q["qweight"].view(FP8_DTYPE).float() * q["scale"]).to(dtype)
