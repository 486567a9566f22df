"""int4: weight-only round-to-nearest, asymmetric: per (row, group of `group_size` inputs) an fp32
scale and a uint8 zero point in [0, 15]; two 4-bit codes packed per byte."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe.errors import ConfigError
from moe.quant.schemes.base import EPS, QUANT_SCHEMES, Scheme, positive_int


def _pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes in [0, 15], last dim even -> bytes holding two codes (low nibble first)."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)


def _unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def check_group_size(group_size: int) -> None:
    positive_int("group_size", group_size)
    if group_size % 2:
        raise ConfigError(f"quant.group_size={group_size} must be even (two int4 codes per byte)")


@QUANT_SCHEMES.register("int4")
class Int4(Scheme):
    """Round-to-nearest asymmetric int4 with zero points (AWQ's / torchao's convention: the range
    [min(w, 0), max(w, 0)] of each group maps onto 0..15)."""

    name, bits, kernel_format = "int4", 4, "int4"

    @dataclass
    class Config:
        group_size: int = 128  # inputs per scale and zero point

        def __post_init__(self):
            check_group_size(self.group_size)

    def _groups(self, in_features: int) -> tuple[int, int]:
        g = self.group_size
        return -(-in_features // g), g

    def quantize(self, w):
        *lead, O, I = w.shape
        n_groups, g = self._groups(I)
        w = w.float()
        if n_groups * g != I:  # a short last group: zero padding (0 is always inside the range)
            w = torch.nn.functional.pad(w, (0, n_groups * g - I))
        w_g = w.reshape(*lead, O, n_groups, g)
        lo = w_g.amin(-1).clamp(max=0)
        hi = w_g.amax(-1).clamp(min=0)
        scale = ((hi - lo) / 15.0).clamp(min=EPS)
        zero = torch.round(-lo / scale).clamp(0, 15)
        codes = (torch.round(w_g / scale.unsqueeze(-1)) + zero.unsqueeze(-1)).clamp(0, 15).to(torch.uint8)
        return {"qweight": _pack_int4(codes.reshape(*lead, O, n_groups * g)), "scale": scale,
                "zero": zero.to(torch.uint8)}

    def dequantize(self, q, in_features, dtype):
        scale, zero = q["scale"], q["zero"]
        *lead, O, n_groups = scale.shape
        codes = _unpack_int4(q["qweight"]).reshape(*lead, O, n_groups, -1).float()
        w = (codes - zero.unsqueeze(-1).float()) * scale.unsqueeze(-1)
        return w.reshape(*lead, O, -1)[..., :in_features].to(dtype)
