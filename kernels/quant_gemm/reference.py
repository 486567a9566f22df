"""Plain PyTorch references of the quantized GEMM kernels: dequantise the whole weight (fp32 math,
rounded to the activations' dtype, as `moe.quant` does per matmul), then matmul in fp32. They define
the semantics the Triton kernels are tested against (tests/kernels/quant_gemm/)."""

from __future__ import annotations

from typing import Optional

import torch

from kernels.moe_gemm.reference import grouped_gemm_reference
from kernels.moe_gemm.routing import MoERouting
from kernels.quant_gemm.checks import QuantWeight


def dequantize_reference(w: QuantWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight `[*lead, O, in_features]` in `dtype`."""
    q, s = w.qweight, w.scale
    if w.fmt == "int8":
        out = q.float() * s
    elif w.fmt == "fp8":
        out = q.view(torch.float8_e4m3fn).float() * s
    else:
        codes = torch.stack([q & 0xF, q >> 4], dim=-1).flatten(-2).float()  # low nibble first
        *lead, O, n_groups = s.shape
        codes = codes.reshape(*lead, O, n_groups, w.group_size)
        out = ((codes - w.zero.float().unsqueeze(-1)) * s.unsqueeze(-1)).reshape(*lead, O, -1)
        out = out[..., : w.in_features]
    return out.to(dtype)


def _x_rows(x: torch.Tensor, x_scale: Optional[torch.Tensor]) -> torch.Tensor:
    """x in fp32: as given, or (W8A8) the E4M3 values times their per-row scale."""
    return x.float() if x_scale is None else x.float() * x_scale.reshape(*x.shape[:-1], 1)


def _w(w: QuantWeight, x: torch.Tensor, x_scale) -> torch.Tensor:
    """deq(W) in fp32: rounded to x's dtype first (the weight-only kernels dequantise into it), or
    exact (W8A8: the E4M3 codes go to the dot undecoded, the scales multiply fp32 sums)."""
    return dequantize_reference(w, torch.float32 if x_scale is not None else x.dtype).float()


def quant_linear_reference(x: torch.Tensor, w: QuantWeight, bias: Optional[torch.Tensor] = None, *,
                           x_scale: Optional[torch.Tensor] = None, out_dtype: Optional[torch.dtype] = None):
    """`x [..., I] @ deq(W)^T (+ bias)`, fp32 math, in x's dtype (or `out_dtype`; W8A8: x E4M3 and
    `x_scale` one fp32 per row)."""
    y = _x_rows(x, x_scale) @ _w(w, x, x_scale).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype or x.dtype)


def quant_gather_reference(x: torch.Tensor, w: QuantWeight, routing: MoERouting, *, x_grouped: bool,
                           y_grouped: bool, scale: Optional[torch.Tensor] = None,
                           x_scale: Optional[torch.Tensor] = None, out_dtype: Optional[torch.dtype] = None):
    """Loop over experts: `y[out(p)] = scale[p] * x[in(p)] @ deq(W[e_p])^T`, fp32 math, zeros for
    dropped assignments; x's dtype (or `out_dtype`), `[N, O]` (grouped or in assignment order
    `t * K + k`). W8A8 as in `quant_linear_reference`."""
    return grouped_gemm_reference(_x_rows(x, x_scale), _w(w, x, x_scale), routing, x_grouped=x_grouped,
                                  y_grouped=y_grouped, scale=scale).to(out_dtype or x.dtype)
