"""MXFP4 (OCP microscaling FP4), as GPT-OSS's published checkpoints store their expert weights:
a tensor `W [..., R, C]` is stored as `<name>_blocks [..., R, C / 32, 16]` uint8 (two e2m1 codes
per byte, the low nibble first) and `<name>_scales [..., R, C / 32]` uint8 (an e8m0 exponent per
32 values, bias 127): W[..., r, 32 g + i] = e2m1(code i of block g) * 2 ** (scale[g] - 127).

Two ways in:

* dequantised (the default, and for training): `dequantized_pieces` wraps a stream of stored
  tensors (`moe.weights.safetensors_pieces`) so that each `_blocks` / `_scales` pair comes out as
  one tensor named `<name>`, dequantised in fp32 by `dequantize_mxfp4` (exact: an e2m1 value times
  a power of two) and transposed to HF's in-memory layout `[..., C, R]`, which the family maps as usual;
* kept (`quantization="mxfp4"`, moe.quant's `mxfp4` scheme, whose stored layout is this one: blocks
  along the input dim, per output row): `kept_route` places the stored bytes into the quantized
  experts' `gate_up_blocks` / `_scales` and `down_blocks` / `_scales` unchanged, only their rows
  reordered (GPT-OSS interleaves gate and up rows; ours are gate rows first). `kept_tensors`
  writes them back the same way on export, so the bytes round-trip bit for bit.

`dequantize_mxfp4` here is deliberately a second, independent dequantiser (the scheme's is
`kernels.mxfp4_gemm.dequantize_mxfp4`); the tests hold each against the other and transformers'.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Iterator, Optional, Sequence

import torch

from moe.weights import Placement

# The 16 e2m1 values by code: sign bit 3, then exponent (2 bits) and mantissa (1 bit).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCK = 32
SUFFIXES = ("_blocks", "_scales")


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`[..., R, G, 16]` uint8 codes and `[..., R, G]` uint8 exponents -> `[..., R, G * 32]`."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != BLOCK // 2:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not pair: "
                         f"blocks must be scales' shape + ({BLOCK // 2},)")
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    b = blocks.to(torch.uint8)
    low, high = lut[(b & 0x0F).long()], lut[(b >> 4).long()]
    values = torch.stack([low, high], dim=-1).flatten(-2)  # [..., R, G, 32]: low nibble first
    exponent = scales.to(torch.int32) - 127
    out = torch.ldexp(values, exponent.unsqueeze(-1).to(torch.float32))
    return out.flatten(-2).to(dtype)


def dequantized_pieces(pieces: Iterable[tuple[str, Callable[[], torch.Tensor]]]
                       ) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """`pieces` with every `<name>_blocks` / `<name>_scales` pair replaced by `<name>` (module
    docstring). A half waits (read into memory) until its partner comes; a half left without
    one passes through under its own name, for the loader to report as unexpected."""
    waiting: dict[str, dict[str, torch.Tensor]] = {}
    for key, read in pieces:
        suffix = next((s for s in SUFFIXES if key.endswith(s)), None)
        if suffix is None:
            yield key, read
            continue
        name = key[: -len(suffix)]
        halves = waiting.setdefault(name, {})
        halves[suffix] = read()
        if len(halves) == 2:
            del waiting[name]
            tensor = dequantize_mxfp4(halves["_blocks"], halves["_scales"]).transpose(-1, -2)
            yield name, (lambda t=tensor: t)
    for name, halves in waiting.items():
        for suffix, tensor in halves.items():
            yield name + suffix, (lambda t=tensor: t)


# HF's fused expert tensors, per layer, and the quantized experts' buffers they fill when kept.
_KEPT = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up|down)_proj_(blocks|scales)$")


def interleaved_rows_to_ours(t: torch.Tensor) -> torch.Tensor:
    """`[E, 2H, ...]` rows gate/up interleaved (HF row 2h + j, j = 0 gate, 1 up) -> gate rows first."""
    E, H2 = t.shape[:2]
    return t.reshape(E, H2 // 2, 2, *t.shape[2:]).transpose(1, 2).reshape(t.shape).contiguous()


def interleaved_rows_to_hf(t: torch.Tensor) -> torch.Tensor:
    E, H2 = t.shape[:2]
    return t.reshape(E, 2, H2 // 2, *t.shape[2:]).transpose(1, 2).reshape(t.shape).contiguous()


def kept_route(route: Callable[[str], Optional[Sequence[Placement]]]):
    """`route` (moe/hf/tensor_map.py `load_route`) with GPT-OSS's stored MXFP4 expert tensors placed,
    as stored, into the quantized experts' buffers (`QuantExperts` of the `mxfp4` scheme)."""
    def kept(name: str) -> Optional[Sequence[Placement]]:
        m = _KEPT.match(name)
        if m is None:
            return route(name)
        layer, proj, part = m.groups()
        transform = interleaved_rows_to_ours if proj == "gate_up" else None
        return [Placement(f"layers.{layer}.ffn.experts.{proj}_{part}", (), transform)]
    return kept


def kept_tensors(state: dict, hf_name: str, our_name: str) -> Optional[dict[str, torch.Tensor]]:
    """The stored `<hf_name>_blocks` / `_scales` of our quantized experts' tensor `our_name`
    (`layers.{i}.ffn.experts.{gate_up,down}_proj`) when `state` holds them as MXFP4, else None."""
    prefix, _, proj = our_name.rpartition(".")
    if proj not in ("gate_up_proj", "down_proj") or f"{prefix}.{proj[:-5]}_blocks" not in state:
        return None
    out = {}
    for part in ("blocks", "scales"):
        t = state[f"{prefix}.{proj[:-5]}_{part}"].detach()
        out[f"{hf_name}_{part}"] = interleaved_rows_to_hf(t) if proj == "gate_up_proj" else t
    return out
