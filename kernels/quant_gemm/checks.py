"""`QuantWeight`: a stored quantized weight as the kernels read it (the tensors `moe.quant`'s
schemes store, unchanged), checked once when it is built; and the launchers' activation checks.

Formats (`fmt`), for a weight of logical shape `[*lead, O, I]` (lead = `[E]` for expert stacks):

    int8  qweight int8 [*lead, O, I],  scale fp32 [*lead, O, 1]                       w = q * s
    int4  qweight uint8 [*lead, O, n_groups * group_size / 2] (two codes a byte, low nibble first;
          the last group zero-padded), scale fp32 and zero uint8 [*lead, O, n_groups]  w = (c - z) * s
    fp8   qweight uint8 [*lead, O, I] (the E4M3 bytes),  scale fp32 [*lead, O, 1]       w = e4m3(q) * s
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from kernels.runtime import FLOAT_DTYPES

FORMATS = ("int8", "int4", "fp8")
FMT_CODES = {"int8": 0, "int4": 1, "fp8": 2}  # the kernels' FMT constexpr


@dataclass(frozen=True)
class QuantWeight:
    fmt: str
    qweight: torch.Tensor
    scale: torch.Tensor
    zero: Optional[torch.Tensor]
    in_features: int
    group_size: int = 128  # int4 only

    def __post_init__(self):
        if self.fmt not in FORMATS:
            raise ValueError(f"QuantWeight.fmt={self.fmt!r} is unknown; choose one of {list(FORMATS)}")
        q, s, z = self.qweight, self.scale, self.zero
        want_q = torch.int8 if self.fmt == "int8" else torch.uint8
        if q.dtype != want_q or q.dim() not in (2, 3):
            raise ValueError(f"QuantWeight({self.fmt}).qweight must be {want_q} [(E,) O, I']; got {q.dtype} "
                             f"{tuple(q.shape)}")
        if not (q.is_contiguous() and s.is_contiguous()):
            raise ValueError(f"QuantWeight({self.fmt}): qweight and scale must be contiguous")
        if s.dtype != torch.float32 or s.dim() != q.dim() or s.shape[:-1] != q.shape[:-1] or s.device != q.device:
            raise ValueError(f"QuantWeight({self.fmt}).scale must be fp32 {tuple(q.shape[:-1])} + (groups,) on "
                             f"{q.device}; got {s.dtype} {tuple(s.shape)} on {s.device}")
        if self.fmt == "int4":
            g = self.group_size
            if g < 2 or g % 2:
                raise ValueError(f"QuantWeight(int4).group_size must be even and >= 2; got {g}")
            n_groups = -(-self.in_features // g)
            if s.shape[-1] != n_groups or q.shape[-1] * 2 != n_groups * g:
                raise ValueError(f"QuantWeight(int4): in_features={self.in_features}, group_size={g} needs "
                                 f"{n_groups} groups and {n_groups * g // 2} bytes a row; got scale "
                                 f"{tuple(s.shape)}, qweight {tuple(q.shape)}")
            if z is None or z.dtype != torch.uint8 or z.shape != s.shape or not z.is_contiguous():
                raise ValueError(f"QuantWeight(int4).zero must be contiguous uint8 {tuple(s.shape)}; got "
                                 f"{None if z is None else (z.dtype, tuple(z.shape))}")
        else:
            if q.shape[-1] != self.in_features or s.shape[-1] != 1:
                raise ValueError(f"QuantWeight({self.fmt}): qweight must be [..., O, in_features="
                                 f"{self.in_features}] and scale [..., O, 1]; got {tuple(q.shape)}, {tuple(s.shape)}")

    @property
    def out_features(self) -> int:
        return self.qweight.shape[-2]

    @property
    def n_experts(self) -> Optional[int]:
        return self.qweight.shape[0] if self.qweight.dim() == 3 else None


def check_act(x: torch.Tensor, w: QuantWeight, rows: int, what: str, x_scale: Optional[torch.Tensor] = None,
              out_dtype: Optional[torch.dtype] = None) -> torch.dtype:
    """Activations: 2-D `[rows, in_features]`, a float dtype, on the weight's device, unit stride in
    features; or, with `x_scale` (W8A8), E4M3 activations and their fp32 `[rows]` scales against an
    fp8 weight. Returns the output dtype (x's, or `out_dtype`, which W8A8 requires)."""
    if x.dim() != 2 or x.shape[0] != rows or x.shape[1] != w.in_features:
        raise ValueError(f"{what}: x must be [{rows}, in_features={w.in_features}]; got {tuple(x.shape)}")
    if x_scale is not None:
        if w.fmt != "fp8" or x.dtype != torch.float8_e4m3fn:
            raise ValueError(f"{what}: x_scale (W8A8) needs float8_e4m3fn x and an fp8 weight; got x {x.dtype}, "
                             f"weight {w.fmt}")
        if x_scale.shape != (rows,) or x_scale.dtype != torch.float32 or not x_scale.is_contiguous():
            raise ValueError(f"{what}: x_scale must be contiguous fp32 [{rows}]; got {x_scale.dtype} "
                             f"{tuple(x_scale.shape)}")
        if out_dtype not in FLOAT_DTYPES:
            raise ValueError(f"{what}: W8A8 needs out_dtype, one of {FLOAT_DTYPES}; got {out_dtype}")
    elif x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{what}: x dtype {x.dtype} is not one of {FLOAT_DTYPES}")
    if x.device != w.qweight.device:
        raise ValueError(f"{what}: x is on {x.device} but the weight on {w.qweight.device}")
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError(f"{what}: x must have unit stride in its last dim (call .contiguous()); strides {x.stride()}")
    return out_dtype or x.dtype
