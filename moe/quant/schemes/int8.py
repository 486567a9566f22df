"""int8: weight-only, symmetric, one fp32 scale per output channel: q = round(w / s), s = amax / 127."""

from __future__ import annotations

import torch

from moe.quant.schemes.base import EPS, QUANT_SCHEMES, Scheme


@QUANT_SCHEMES.register("int8")
class Int8(Scheme):
    name, bits, kernel_format = "int8", 8, "int8"

    def quantize(self, w):
        w = w.float()
        scale = (w.abs().amax(-1, keepdim=True) / 127.0).clamp(min=EPS)
        return {"qweight": torch.round(w / scale).clamp(-127, 127).to(torch.int8), "scale": scale}

    def dequantize(self, q, in_features, dtype):
        return (q["qweight"].float() * q["scale"]).to(dtype)
