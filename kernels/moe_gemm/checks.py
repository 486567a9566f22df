"""Input checks of the MoE kernel launchers: shapes, dtypes, devices, strides and tile sizes,
each failing with a ValueError that names the launcher (`what`) and the argument."""

from __future__ import annotations

from typing import Optional

import torch

from kernels.moe_gemm.routing import MoERouting
from kernels.runtime import FLOAT_DTYPES


def check_act(name: str, t: torch.Tensor, rows: int, cols: Optional[int], routing: MoERouting, what: str):
    """An activation: 2-D `[rows, cols or any]`, a float dtype, on the routing's device, unit stride in features."""
    if t.dim() != 2:
        raise ValueError(f"{what}: {name} must be 2-D [rows, features]; got shape {tuple(t.shape)}")
    if t.shape[0] != rows or (cols is not None and t.shape[1] != cols):
        want = f"[{rows}, {cols if cols is not None else '*'}]"
        raise ValueError(f"{what}: {name} must be {want}; got {tuple(t.shape)}")
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{what}: {name} dtype {t.dtype} is not one of {FLOAT_DTYPES}")
    if t.device != routing.device:
        raise ValueError(f"{what}: {name} is on {t.device} but the routing on {routing.device}")
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{what}: {name} must have unit stride in its last dim (call .contiguous()); "
                         f"strides {t.stride()}")


def check_weight(name: str, w: torch.Tensor, routing: MoERouting, dtype: torch.dtype, what: str):
    """Stacked expert weights: contiguous `[n_experts, out, in]` in the activations' dtype and device."""
    if w.dim() != 3 or w.shape[0] != routing.n_experts:
        raise ValueError(f"{what}: {name} must be [n_experts={routing.n_experts}, out, in]; "
                         f"got shape {tuple(w.shape)}")
    if w.dtype != dtype:
        raise ValueError(f"{what}: {name} dtype {w.dtype} != activation dtype {dtype} (cast both to one dtype)")
    if w.device != routing.device:
        raise ValueError(f"{what}: {name} is on {w.device} but the routing on {routing.device}")
    if not w.is_contiguous():
        raise ValueError(f"{what}: {name} must be contiguous (call .contiguous()); strides {w.stride()}")


def check_scale(scale: Optional[torch.Tensor], routing: MoERouting, what: str):
    """A per-assignment scale (router weights): None, or contiguous fp32 `[N]` in sorted order."""
    if scale is None:
        return
    if scale.shape != (routing.n_assign,) or scale.dtype != torch.float32 or not scale.is_contiguous():
        raise ValueError(f"{what}: scale must be a contiguous fp32 [N={routing.n_assign}] tensor in sorted "
                         f"order; got {scale.dtype} of shape {tuple(scale.shape)}")
    if scale.device != routing.device:
        raise ValueError(f"{what}: scale is on {scale.device} but the routing on {routing.device}")


def check_tiles(tiles: Optional[dict], names) -> None:
    """Fixed tile sizes (`tiles`, or None: autotuned) must set every one of `names` to a power of two >= 16."""
    if tiles is None:
        return
    for n in names:
        v = tiles.get(n)
        if v is None or v < 16 or v & (v - 1):
            raise ValueError(f"tile {n}={v!r} must be a power of two >= 16 (tl.dot); got tiles {tiles}")

