"""Plain PyTorch references of the quantized GEMM kernels: dequantise the whole weight (fp32 math,
rounded to the activations' dtype, as `moe.quant` does per matmul), then matmul in fp32. They define
the semantics the Triton kernels are tested against (tests/kernels/quant_gemm/)."""

from __future__ import annotations

from typing import Optional

import torch

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


def quant_linear_reference(x: torch.Tensor, w: QuantWeight, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`x [..., I] @ deq(W)^T (+ bias)`, fp32 math, x's dtype."""
    y = x.float() @ dequantize_reference(w, x.dtype).float().t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def quant_gather_reference(x: torch.Tensor, w: QuantWeight, routing: MoERouting, *, x_grouped: bool,
                           y_grouped: bool, scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Loop over experts: `y[out(p)] = scale[p] * x[in(p)] @ deq(W[e_p])^T`, fp32 math, zeros for
    dropped assignments; x's dtype, `[N, O]` (grouped or in assignment order `t * K + k`)."""
    xs = (x if x_grouped else x[routing.sorted_token.long()]).float()
    wd = dequantize_reference(w, x.dtype).float()
    out = xs.new_zeros(routing.n_assign, w.out_features)
    offs = routing.group_offs.tolist()
    for e in range(routing.n_experts):
        if offs[e + 1] > offs[e]:
            out[offs[e]:offs[e + 1]] = xs[offs[e]:offs[e + 1]] @ wd[e].t()
    if scale is not None:
        out = out * torch.where(routing.sorted_expert < routing.n_experts, scale, 0.0)[:, None]
    out = out.to(x.dtype)
    if y_grouped:
        return out
    placed = torch.empty_like(out)
    placed[routing.sorted_assign.long()] = out
    return placed
