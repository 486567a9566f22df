"""`grouped_mm(x_ND, w_EDH, offs_E)`: one matmul per contiguous row group, in one call.

Uses `torch.nn.functional.grouped_mm` (or the older `torch._grouped_mm`) when the installed
torch has it and the operands meet its layout rules (16-byte aligned strides, fp32/bf16 on
CPU, bf16 on CUDA SM80+); otherwise a per-group loop of plain matmuls gives the same result,
so odd test shapes and old torch versions still run.
"""

from __future__ import annotations

import torch

_GROUPED_MM = getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def _aligned(t: torch.Tensor) -> bool:
    item = t.element_size()
    return all((s * item) % 16 == 0 for s, n in zip(t.stride(), t.shape) if n > 1 and s != 1)


def native_grouped_mm_ok(x_ND: torch.Tensor, w_EDH: torch.Tensor) -> bool:
    if _GROUPED_MM is None or x_ND.dtype != w_EDH.dtype:
        return False
    if torch.compiler.is_compiling() and x_ND.dtype != torch.bfloat16:
        return False  # grouped_mm's meta kernel (used while tracing) accepts only bf16
    if x_ND.device.type == "cuda":
        if x_ND.dtype != torch.bfloat16 or torch.cuda.get_device_capability(x_ND.device)[0] < 8:
            return False
    elif x_ND.device.type == "cpu":
        if x_ND.dtype not in (torch.float32, torch.bfloat16):
            return False
    else:
        return False
    inner = x_ND.shape[-1] * x_ND.element_size()
    out = w_EDH.shape[-1] * x_ND.element_size()
    return inner % 16 == 0 and out % 16 == 0 and _aligned(x_ND) and _aligned(w_EDH)


def grouped_mm(x_ND: torch.Tensor, w_EDH: torch.Tensor, offs_E: torch.Tensor) -> torch.Tensor:
    """Rows offs[e-1]:offs[e] of x are multiplied by w[e]; rows past offs[-1] are ignored.

    x_ND: [N, D] rows sorted by group; w_EDH: [E, D, H] (a transposed view is fine);
    offs_E: int32 cumulative row counts. Returns [N, H] (rows past offs[-1] are zero).
    """
    if native_grouped_mm_ok(x_ND, w_EDH):
        return _GROUPED_MM(x_ND, w_EDH, offs=offs_E)
    return grouped_mm_loop(x_ND, w_EDH, offs_E)


def grouped_mm_loop(x_ND: torch.Tensor, w_EDH: torch.Tensor, offs_E: torch.Tensor) -> torch.Tensor:
    """Reference/fallback: a Python loop of matmuls over the groups."""
    bounds = [0] + offs_E.tolist()
    outs = [x_ND[bounds[e]:bounds[e + 1]] @ w_EDH[e] for e in range(w_EDH.shape[0])]
    tail = x_ND.shape[0] - bounds[-1]
    if tail:
        outs.append(x_ND.new_zeros(tail, w_EDH.shape[-1]))
    return torch.cat(outs, dim=0)
