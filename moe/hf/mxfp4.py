"""MXFP4 (OCP microscaling FP4), as GPT-OSS's published checkpoints store their expert weights:
a tensor `W [..., R, C]` is stored as `<name>_blocks [..., R, C / 32, 16]` uint8 (two e2m1 codes
per byte, the low nibble first) and `<name>_scales [..., R, C / 32]` uint8 (an e8m0 exponent per
32 values, bias 127): W[..., r, 32 g + i] = e2m1(code i of block g) * 2 ** (scale[g] - 127).

`dequantize_mxfp4` is the plain-PyTorch dequantiser; `dequantized_pieces` wraps a stream of
stored tensors (`moe.weights.safetensors_pieces`) so that each `_blocks` / `_scales` pair comes
out as one tensor named `<name>`, dequantised in fp32 (exact: an e2m1 value times a power of
two) and transposed to HF's in-memory layout `[..., C, R]`, which the family maps as usual.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

import torch

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
