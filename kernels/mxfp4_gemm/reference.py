"""Plain PyTorch references of the MXFP4 GEMM kernels: dequantise the whole weight (exact in fp32: an
e2m1 value times a power of two), round it to the activations' dtype (as `moe.quant` does per
matmul), then matmul in fp32. They define what the Triton kernels are tested against
(tests/kernels/mxfp4_gemm/), and `moe.quant`'s `mxfp4` scheme dequantises with `dequantize_mxfp4`."""

from __future__ import annotations

from typing import Optional

import torch

from kernels.moe_gemm.reference import grouped_gemm_reference
from kernels.moe_gemm.routing import MoERouting
from kernels.mxfp4_gemm.checks import MXWeight

# The 16 e2m1 values by code: sign bit 3, then a 2-bit exponent (bias 1) and a 1-bit mantissa.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, in_features: Optional[int] = None,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`[..., O, G, 16]` codes and `[..., O, G]` exponents -> `[..., O, in_features]` (default G * 32)."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2).long()  # [..., O, G, 32], low nibble first
    values = torch.ldexp(lut[codes], (scales.to(torch.int32) - 127).unsqueeze(-1).to(torch.float32))
    out = values.flatten(-2)
    return (out if in_features is None else out[..., :in_features]).to(dtype)


def dequantize_reference(w: MXWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return dequantize_mxfp4(w.blocks, w.scales, w.in_features, dtype)


def mxfp4_linear_reference(x: torch.Tensor, w: MXWeight, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`x [..., I] @ deq(W)^T (+ bias)`: the weight rounded to x's dtype, fp32 math, x's dtype."""
    y = x.float() @ dequantize_reference(w, x.dtype).float().t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def mxfp4_gather_reference(x: torch.Tensor, w: MXWeight, routing: MoERouting, *, x_grouped: bool,
                           y_grouped: bool, scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Loop over experts: `y[out(p)] = scale[p] * x[in(p)] @ deq(W[e_p])^T`, zeros for dropped
    assignments, `[N, O]` grouped or in assignment order `t * K + k`; fp32 math, x's dtype."""
    wd = dequantize_reference(w, x.dtype).float()  # rounded to x's dtype, as the kernels dequantise
    return grouped_gemm_reference(x.float(), wd, routing, x_grouped=x_grouped, y_grouped=y_grouped,
                                  scale=scale).to(x.dtype)


